// Newton-Schulz iterations with bf16 products (see newton_schulz_bf16.h).
#include "optim/newton_schulz_bf16.h"

#include <Eigen/Dense>
#include <algorithm>

#include "runtime/core/dtype.h"
#include "runtime/cpu_gemm_bf16.h"

namespace mfsdp {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Thread-local bf16 operands: bf16(X) [m, n], A and B [m, m]; f32 operands for the widening
/// path. Grown, never shrunk.
struct Bf16Scratch {
  std::vector<bf16> x, a, b;
  std::vector<float> wa, wb, wc;
};

Bf16Scratch& scratch() {
  thread_local Bf16Scratch s;
  return s;
}

template <class T>
T* grown(std::vector<T>& v, int64_t size) {
  if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
  return v.data();
}

/// rows x cols bf16 block (leading dimension ld) widened exactly into dst [rows, cols].
void widen(const bf16* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = bf16_to_float(src[r * ld + c]);
}

/// cpu_gemm_bf16_fused on CPUs without bf16 instructions: the bf16 operands widened exactly to
/// f32, an f32 GEMM, the sum with beta * D in f32, one store (rounded to bf16 when bf16_out).
void gemm_fused_widened(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                        const bf16* B, int64_t ldb, float beta, const void* D, void* C, int64_t ldc, bool bf16_out) {
  Bf16Scratch& s = scratch();
  float* wa = grown(s.wa, M * K);
  float* wb = grown(s.wb, K * N);
  float* wc = grown(s.wc, M * N);
  widen(A, M, K, lda, wa);
  widen(B, tb ? N : K, tb ? K : N, ldb, wb);
  Eigen::Map<RowMat> c(wc, M, N);
  const Eigen::Map<const RowMat> a(wa, M, K);
  if (tb)
    c.noalias() = alpha * (a * Eigen::Map<const RowMat>(wb, N, K).transpose());
  else
    c.noalias() = alpha * (a * Eigen::Map<const RowMat>(wb, K, N));
  const auto* d16 = static_cast<const bf16*>(D);
  const auto* d32 = static_cast<const float*>(D);
#pragma omp parallel for schedule(static) if (M * N >= (int64_t(1) << 16))
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < N; ++j) {
      const int64_t at = r * ldc + j;
      const float add = beta == 0.f ? 0.f : beta * (bf16_out ? bf16_to_float(d16[at]) : d32[at]);
      const float v = wc[r * N + j] + add;
      if (bf16_out)
        static_cast<bf16*>(C)[at] = float_to_bf16(v);
      else
        static_cast<float*>(C)[at] = v;
    }
}

/// cpu_gemm_bf16_fused where the CPU has bf16 instructions, else its widening equivalent.
void gemm_fused(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda, const bf16* B,
                int64_t ldb, float beta, const void* D, void* C, int64_t ldc, bool bf16_out) {
  if (cpu_gemm_bf16_native())
    cpu_gemm_bf16_fused(tb, M, N, K, alpha, A, lda, B, ldb, beta, D, C, ldc, bf16_out);
  else
    gemm_fused_widened(tb, M, N, K, alpha, A, lda, B, ldb, beta, D, C, ldc, bf16_out);
}

}  // namespace

float* quintic_iterations_bf16(float* x, float* y, int64_t m, int64_t n, const std::vector<QuinticStep>& steps) {
  if (m == 0 || n == 0) return x;
  Bf16Scratch& s = scratch();
  bf16* xh = grown(s.x, m * n);
  bf16* A = grown(s.a, m * m);
  bf16* B = grown(s.b, m * m);
  const int64_t mn = m * n;
  for (const QuinticStep& k : steps) {
#pragma omp parallel for schedule(static) if (mn >= (int64_t(1) << 16))
    for (int64_t i = 0; i < mn; ++i) xh[i] = float_to_bf16(x[i]);
    gemm_fused(true, m, m, n, 1.f, xh, n, xh, n, 0.f, nullptr, A, m, true);  // A = X X^T
    gemm_fused(false, m, m, m, k.c, A, m, A, m, k.b, A, B, m, true);         // B = c A A + b A
    gemm_fused(false, m, n, m, 1.f, B, m, xh, n, k.a, x, y, n, false);       // Y = B X + a X
    std::swap(x, y);
  }
  return x;
}

}  // namespace mfsdp
