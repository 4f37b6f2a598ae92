// CUDA kernels of the Llama building blocks (see llama_kernels.h).
#include "runtime/cuda/llama_kernels.h"

#include <climits>
#include <stdexcept>
#include <string>

#include "runtime/core/cuda_check.h"
#include "runtime/cuda/cuda_common.cuh"

namespace mfsdp::cuda_llama {
namespace {

using namespace cuda_detail;

// Out = float, or uint16_t for bf16 bits (the f32 result rounded as convert rounds it).
template <class Out>
__global__ void rmsnorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w, Out* __restrict__ y,
                                       float* __restrict__ rstd, int64_t cols, float eps) {
  __shared__ float sh[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) s += xr[c] * xr[c];
  const float rs = 1.0f / sqrtf(block_sum(s, sh) / static_cast<float>(cols) + eps);
  Out* yr = y + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) store_as(yr + c, xr[c] * rs * w[c]);
  if (threadIdx.x == 0) rstd[r] = rs;
}

__global__ void rmsnorm_backward_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                           const float* __restrict__ w, const float* __restrict__ rstd,
                                           float* __restrict__ dx, int64_t cols) {
  __shared__ float sh[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  const float* dyr = dy + r * cols;
  const float s = rstd[r];
  float a = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) a += dyr[c] * w[c] * xr[c];
  const float mean_dn_n = block_sum(a, sh) / static_cast<float>(cols) * s;  // mean(dn * n)
  float* dxr = dx + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) dxr[c] += s * (dyr[c] * w[c] - xr[c] * (s * mean_dn_n));
}

// One thread per (row, head, i < d/2) pair; the frequency is computed as the CPU backend does (f32).
__global__ void rope_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t BT, int64_t T, int64_t heads,
                            int64_t d, float theta, bool transpose) {
  const int64_t half = d / 2, n = BT * heads * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, h = (k / half) % heads, row = k / (half * heads);
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(d));
    const float ang = static_cast<float>(row % T) * inv_freq;
    const float c = cosf(ang), s = sinf(ang);
    const int64_t base = row * heads * d + h * d;
    const float a = x[base + i], b = x[base + i + half];
    if (transpose) {
      y[base + i] += a * c + b * s;
      y[base + i + half] += b * c - a * s;
    } else {
      y[base + i] = a * c - b * s;
      y[base + i + half] = b * c + a * s;
    }
  }
}

template <class Out>
__global__ void swiglu_forward_kernel(const float* __restrict__ g, const float* __restrict__ u, Out* __restrict__ y,
                                      int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_as(y + i, g[i] / (1.0f + expf(-g[i])) * u[i]);
}

__global__ void swiglu_backward_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                       const float* __restrict__ dy, float* __restrict__ dg, float* __restrict__ du,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float sig = 1.0f / (1.0f + expf(-g[i]));
    if (dg) dg[i] += dy[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
    if (du) du[i] += dy[i] * (g[i] * sig);
  }
}

unsigned row_grid(int64_t rows, const char* op) {
  if (rows > INT_MAX)
    throw std::invalid_argument(std::string("[") + op + "] rows=" + std::to_string(rows) + " exceeds the grid limit");
  return static_cast<unsigned>(rows);
}

}  // namespace

template <class Out>
void rmsnorm_forward(const float* x, const float* w, Out* y, float* rstd, int64_t rows, int64_t cols, float eps) {
  if (rows <= 0 || cols <= 0) return;
  rmsnorm_forward_kernel<<<row_grid(rows, "rmsnorm_forward"), kThreads>>>(x, w, y, rstd, cols, eps);
  CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}
template void rmsnorm_forward<float>(const float*, const float*, float*, float*, int64_t, int64_t, float);
template void rmsnorm_forward<uint16_t>(const float*, const float*, uint16_t*, float*, int64_t, int64_t, float);

void rmsnorm_backward_dx(const float* dy, const float* x, const float* w, const float* rstd, float* dx, int64_t rows,
                         int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  rmsnorm_backward_dx_kernel<<<row_grid(rows, "rmsnorm_backward"), kThreads>>>(dy, x, w, rstd, dx, cols);
  CUDA_CHECK_LAUNCH("rmsnorm_backward_dx_kernel");
}

void rope(const float* x, float* y, int64_t B, int64_t T, int64_t heads, int64_t d, float theta, bool transpose) {
  const int64_t n = B * T * heads * (d / 2);
  if (n <= 0) return;
  rope_kernel<<<grid_for(n), kThreads>>>(x, y, B * T, T, heads, d, theta, transpose);
  CUDA_CHECK_LAUNCH("rope_kernel");
}

template <class Out>
void swiglu_forward(const float* g, const float* u, Out* y, int64_t n) {
  if (n <= 0) return;
  swiglu_forward_kernel<<<grid_for(n), kThreads>>>(g, u, y, n);
  CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
}
template void swiglu_forward<float>(const float*, const float*, float*, int64_t);
template void swiglu_forward<uint16_t>(const float*, const float*, uint16_t*, int64_t);

void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) {
  if (n <= 0) return;
  swiglu_backward_kernel<<<grid_for(n), kThreads>>>(g, u, dy, dg, du, n);
  CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
}

}  // namespace mfsdp::cuda_llama
