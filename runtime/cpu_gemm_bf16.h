// CPU GEMM with bf16 operands and f32 accumulation and output, on the CPU's bf16 instructions
// (AVX512-BF16, AMX) through oneDNN's matmul primitive. Used by the CPU backend's gemm_bf16.
#pragma once
#include <cstdint>

namespace mfsdp {

/// Whether cpu_gemm_bf16 runs on bf16 instructions here: built with oneDNN and its effective ISA
/// (which ONEDNN_MAX_CPU_ISA can lower) includes AVX512-BF16 or AMX. Otherwise the CPU backend
/// widens the operands to f32 and runs its SGEMM.
bool cpu_gemm_bf16_native();

/// One line for the start-up output: which path bf16 matmuls take on this CPU.
const char* cpu_gemm_bf16_path();

/// Row-major C[M,N] = alpha * op(A) op(B) + beta * C with A, B bf16 (op(A) is [M,K], op(B) [K,N];
/// ta/tb: stored transposed) and C f32; f32 accumulation. One oneDNN matmul primitive per shape,
/// transposes, alpha and beta, created on first use and cached. Deterministic for a fixed thread
/// count and ISA. Requires cpu_gemm_bf16_native(); throws std::runtime_error on a oneDNN failure.
/// The primitive cache is not locked: call it from one thread at a time (oneDNN parallelises inside).
void cpu_gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
                   float beta, float* C);

/// Row-major C = alpha * A op(B) + beta * D with bf16 A and B: A [M,K] (leading dimension lda),
/// op(B) [K,N] (B stored [N,K] with leading dimension ldb when tb, else [K,N]); C and D [M,N] with
/// leading dimension ldc, both bf16 (bf16_out) or both f32 (D may be null when beta == 0; it must
/// not overlap C). The product accumulates in f32 and the sum with beta * D is formed in f32, then
/// stored once (rounded once to bf16 when bf16_out, as a cuBLAS bf16 GEMM with an f32 compute type
/// rounds). Primitives are cached per shape, strides and coefficients; deterministic for a fixed
/// thread count and ISA. Requires cpu_gemm_bf16_native(); throws std::invalid_argument for
/// beta != 0 without D, std::runtime_error on a oneDNN failure. One thread at a time.
void cpu_gemm_bf16_fused(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
                         const void* B, int64_t ldb, float beta, const void* D, void* C, int64_t ldc, bool bf16_out);

}  // namespace mfsdp
