#include "runtime/cuda/gemm_bf16.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "runtime/core/cuda_check.h"
#include "runtime/cuda/device_api.h"
#include "runtime/kernels.h"

namespace mfsdp::cuda_gemm {
namespace {

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("[gemm_bf16] ") + what + "=" + std::to_string(v) +
                                " outside the int range cuBLAS accepts");
  return static_cast<int>(v);
}

}  // namespace

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
               float beta, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // no products: C = beta * C, as the f32 gemm does
    kernels(Device::CUDA).gemm(ta, tb, M, N, 0, alpha, nullptr, nullptr, beta, C);
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const int m = as_int(N, "N"), n = as_int(M, "M"), k = as_int(K, "K");
  const int lda = as_int(ta ? M : K, "lda"), ldb = as_int(tb ? K : N, "ldb");
  auto h = static_cast<cublasHandle_t>(cuda::cublas_handle());
  CUBLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, B,
                            CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

}  // namespace mfsdp::cuda_gemm
