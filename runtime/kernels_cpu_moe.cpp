// CPU mixture-of-experts row kernels (kernels_cpu_moe.h): plain loops over rows, dot products in f64.
#include "runtime/kernels_cpu_moe.h"

#include <algorithm>
#include <cmath>

namespace mfsdp {

void CpuMoeKernels::gather_rows(const float* src, const int32_t* index, float* out, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) std::copy_n(src + static_cast<int64_t>(index[i]) * cols, cols, out + i * cols);
}

void CpuMoeKernels::combine_rows(const float* rows, const int32_t* row_of, const float* weight, float* y, int64_t N,
                                 int64_t K, int64_t cols, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* yn = y + n * cols;
    if (!accumulate) std::fill(yn, yn + cols, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const float* r = rows + static_cast<int64_t>(row_of[n * K + j]) * cols;
      if (weight == nullptr) {
        for (int64_t c = 0; c < cols; ++c) yn[c] += r[c];
      } else {
        const float w = weight[n * K + j];
        for (int64_t c = 0; c < cols; ++c) yn[c] += w * r[c];
      }
    }
  }
}

void CpuMoeKernels::combine_rows_backward(const float* dy, const int32_t* index, const float* weight,
                                          const float* rows, float* drows, float* dweight, int64_t R, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < R; ++i) {
    const float* d = dy + static_cast<int64_t>(index[i]) * cols;
    const float* r = rows + i * cols;
    const float w = weight[i];
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) {
      drows[i * cols + c] = w * d[c];
      dot += static_cast<double>(d[c]) * r[c];
    }
    dweight[i] = static_cast<float>(dot);
  }
}

void CpuMoeKernels::gated_add_rows(const float* x, float* gate, float* y, int64_t N, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float g = 1.0f / (1.0f + std::exp(-gate[n]));
    gate[n] = g;
    for (int64_t c = 0; c < cols; ++c) y[n * cols + c] += g * x[n * cols + c];
  }
}

void CpuMoeKernels::gated_add_rows_backward(const float* dy, const float* x, const float* gate, float* dx,
                                            float* dlogit, int64_t N, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float g = gate[n];
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) {
      dx[n * cols + c] = g * dy[n * cols + c];
      dot += static_cast<double>(dy[n * cols + c]) * x[n * cols + c];
    }
    dlogit[n] = static_cast<float>(dot) * g * (1.0f - g);
  }
}

}  // namespace mfsdp
