// Single-threaded f32 GEMM on the calling thread through oneDNN's SGEMM, for kernels that split
// their own work into fixed bands (the CPU orthogonalizers): the result of each call depends on
// the shapes and the ISA only, never on the OpenMP thread count.
#pragma once
#include <cstdint>

namespace mfsdp {

/// Whether cpu_sgemm_serial is available (built with oneDNN).
bool cpu_sgemm_serial_available();

/// Row-major C[M,N] = alpha * op(A) op(B) + beta * C, all f32, run by the calling thread alone
/// (oneDNN's SGEMM is sequential inside an active OpenMP parallel region; outside one the
/// calling thread's OpenMP thread count is set to 1 for the call). op(A) is [M,K] (ta: A stored [K,M]), op(B) is [K,N] (tb: B
/// stored [N,K]); lda, ldb, ldc are the stored row lengths. Throws std::runtime_error when
/// oneDNN fails or when built without oneDNN.
void cpu_sgemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                      const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace mfsdp
