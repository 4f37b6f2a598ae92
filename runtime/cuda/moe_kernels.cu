// CUDA mixture-of-experts row kernels (moe_kernels.h). Elementwise kernels run grid-stride loops
// over (row, column); the two with a per-row dot product run one block per row, each thread a
// fixed strided subset of the columns, then block_sum's fixed tree, in f64.
#include "runtime/cuda/moe_kernels.h"

#include <climits>
#include <stdexcept>
#include <string>

#include "runtime/core/cuda_check.h"
#include "runtime/cuda/cuda_common.cuh"

namespace mfsdp::cuda_moe {
namespace {

using namespace cuda_detail;

__global__ void gather_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ index,
                                   float* __restrict__ out, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[i] = src[static_cast<int64_t>(index[r]) * cols + c];
  }
}

__global__ void combine_rows_kernel(const float* __restrict__ rows, const int32_t* __restrict__ row_of,
                                    const float* __restrict__ weight, float* __restrict__ y, int64_t N, int64_t K,
                                    int64_t cols, bool accumulate) {
  const int64_t total = N * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / cols, c = i - n * cols;
    float acc = accumulate ? y[i] : 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const float v = rows[static_cast<int64_t>(row_of[n * K + j]) * cols + c];
      acc += weight ? weight[n * K + j] * v : v;
    }
    y[i] = acc;
  }
}

__global__ void combine_rows_backward_kernel(const float* __restrict__ dy, const int32_t* __restrict__ index,
                                             const float* __restrict__ weight, const float* __restrict__ rows,
                                             float* __restrict__ drows, float* __restrict__ dweight, int64_t cols) {
  __shared__ double sh[kThreads / 32];
  const int64_t i = blockIdx.x;
  const float* d = dy + static_cast<int64_t>(index[i]) * cols;
  const float* r = rows + i * cols;
  const float w = weight[i];
  double dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    drows[i * cols + c] = w * d[c];
    dot += static_cast<double>(d[c]) * r[c];
  }
  dot = block_sum(dot, sh);
  if (threadIdx.x == 0) dweight[i] = static_cast<float>(dot);
}

__global__ void gated_add_rows_kernel(const float* __restrict__ x, float* __restrict__ gate, float* __restrict__ y,
                                      int64_t cols) {
  const int64_t n = blockIdx.x;
  const float g = 1.0f / (1.0f + expf(-gate[n]));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[n * cols + c] += g * x[n * cols + c];
  __syncthreads();  // every thread has read the logit before it is overwritten
  if (threadIdx.x == 0) gate[n] = g;
}

__global__ void gated_add_rows_backward_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                               const float* __restrict__ gate, float* __restrict__ dx,
                                               float* __restrict__ dlogit, int64_t cols) {
  __shared__ double sh[kThreads / 32];
  const int64_t n = blockIdx.x;
  const float g = gate[n];
  double dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    dx[n * cols + c] = g * dy[n * cols + c];
    dot += static_cast<double>(dy[n * cols + c]) * x[n * cols + c];
  }
  dot = block_sum(dot, sh);
  if (threadIdx.x == 0) dlogit[n] = static_cast<float>(dot) * g * (1.0f - g);
}

unsigned row_grid(int64_t rows, const char* op) {
  if (rows > INT_MAX)
    throw std::invalid_argument(std::string("[") + op + "] rows=" + std::to_string(rows) + " exceeds the grid limit");
  return static_cast<unsigned>(rows);
}

}  // namespace

void gather_rows(const float* src, const int32_t* index, float* out, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  gather_rows_kernel<<<grid_for(rows * cols), kThreads>>>(src, index, out, rows, cols);
  CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

void combine_rows(const float* rows, const int32_t* row_of, const float* weight, float* y, int64_t N, int64_t K,
                  int64_t cols, bool accumulate) {
  if (N <= 0 || cols <= 0) return;
  combine_rows_kernel<<<grid_for(N * cols), kThreads>>>(rows, row_of, weight, y, N, K, cols, accumulate);
  CUDA_CHECK_LAUNCH("combine_rows_kernel");
}

void combine_rows_backward(const float* dy, const int32_t* index, const float* weight, const float* rows,
                           float* drows, float* dweight, int64_t R, int64_t cols) {
  if (R <= 0) return;
  combine_rows_backward_kernel<<<row_grid(R, "combine_rows_backward"), kThreads>>>(dy, index, weight, rows, drows,
                                                                                    dweight, cols);
  CUDA_CHECK_LAUNCH("combine_rows_backward_kernel");
}

void gated_add_rows(const float* x, float* gate, float* y, int64_t N, int64_t cols) {
  if (N <= 0) return;
  gated_add_rows_kernel<<<row_grid(N, "gated_add_rows"), kThreads>>>(x, gate, y, cols);
  CUDA_CHECK_LAUNCH("gated_add_rows_kernel");
}

void gated_add_rows_backward(const float* dy, const float* x, const float* gate, float* dx, float* dlogit, int64_t N,
                             int64_t cols) {
  if (N <= 0) return;
  gated_add_rows_backward_kernel<<<row_grid(N, "gated_add_rows_backward"), kThreads>>>(dy, x, gate, dx, dlogit, cols);
  CUDA_CHECK_LAUNCH("gated_add_rows_backward_kernel");
}

}  // namespace mfsdp::cuda_moe
