// The mixed-precision GEMM of the CUDA backend (Kernels::gemm_bf16): bf16 operands, f32
// accumulation and output, on tensor cores. Internal to runtime/cuda.
#pragma once
#include <cstdint>

#include "runtime/kernels.h"

namespace mfsdp::cuda_gemm {

/// C[M,N] = alpha * op(A) op(B) + beta * C, row-major; A, B bf16 device buffers (op(A) [M,K],
/// A stored [K,M] when trans_a; op(B) [K,N], B stored [N,K] when trans_b), C f32, on the compute
/// stream. cuBLASLt (cublasLtMatmul, CUBLAS_COMPUTE_32F, the heuristic's first algorithm for the
/// shape and the operands' pointer alignments, cached with its descriptors; a 32 MiB workspace
/// allocated on the first call), or
/// gemm_bf16_gemmex when the heuristic offers no algorithm. Empty shapes are handled (K = 0
/// scales C by beta). Throws std::invalid_argument when a size exceeds int, std::runtime_error
/// on a cuBLAS error.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
               const void* B, float beta, float* C);

/// Kernels::gemm_bf16_epilogue through cuBLASLt: the same product with epilogue BIAS,
/// GELU_AUX_BIAS or DGELU_BGRAD (bias and auxiliary buffers f32, the output's type; the auxiliary
/// buffer's leading dimension is N), planned and cached per shape and epilogue like gemm_bf16.
/// Returns false, writing nothing, when a GELU epilogue's N is not a multiple of 8, C, the bias or
/// the auxiliary buffer is not 16-byte aligned, or cuBLASLt offers or accepts no algorithm (the
/// plan key includes the vectors' alignments, which the heuristic reads from their pointers). Throws
/// std::invalid_argument when a required buffer is null, std::runtime_error on a cuBLAS error.
bool gemm_bf16_epilogue(Kernels::Epilogue e, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const void* A, const void* B, float* C, float* bias, float* aux);

/// The same product through cublasGemmEx (CUDA_R_16BF inputs, CUBLAS_COMPUTE_32F) on the shared
/// cuBLAS handle: the fallback, and the reference the tests and the benchmark compare against.
void gemm_bf16_gemmex(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                      const void* B, float beta, float* C);

}  // namespace mfsdp::cuda_gemm
