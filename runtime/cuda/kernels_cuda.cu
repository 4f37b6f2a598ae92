// CUDA backend (kernels.h): cuBLAS SGEMM for every matrix product, hand-written kernels for the rest.
//
// Everything runs on the legacy default stream (stream 0), so kernels are ordered with each other and
// with the synchronous cudaMemcpy of Tensor::to / to_vector: a host read after a kernel sees its
// result. Reductions are deterministic (fixed launch shapes derived from the sizes only, fixed tree
// order, no atomics): the same inputs give bitwise the same outputs on every run. Embedding backward
// adds in the CPU's exact order (token positions in increasing order per row), so it matches the CPU
// backend bitwise. SGEMM runs in plain FP32 (CUBLAS_DEFAULT_MATH: no TF32), so results agree with the
// CPU backend to ~1e-6 relative.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/core/cuda_check.h"
#include "runtime/cuda/device_api.h"
#include "runtime/cuda/cuda_common.cuh"
#include "runtime/cuda/gemm_bf16.h"
#include "runtime/cuda/flash_attention.h"
#include "runtime/cuda/llama_kernels.h"
#include "runtime/kernels.h"

namespace mfsdp {
namespace {

using namespace cuda_detail;

constexpr int64_t kColChunk = 64;    // rows per partial sum of the column reductions

int to_int(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("[") + op + "] " + what + "=" + std::to_string(v) +
                                " outside the int range cuBLAS accepts");
  return static_cast<int>(v);
}

// ---------------- elementwise ----------------

// f32 -> bf16, round to nearest even, NaN kept as quiet NaN: the bit recipe of float_to_bf16 (dtype.h).
__global__ void f32_to_bf16_kernel(const float* __restrict__ s, uint16_t* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t u = __float_as_uint(s[i]);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) d[i] = static_cast<uint16_t>((u >> 16) | 0x0040u);
    else d[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}
__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ s, float* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = __uint_as_float(static_cast<uint32_t>(s[i]) << 16);
}
__global__ void fill_kernel(float* x, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}
__global__ void axpy_kernel(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += a * x[i];
}
__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}
__global__ void scale_kernel(float* x, float a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= a;
}
__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += b[i % cols];
}

// ---------------- column reductions (bias_grad, LayerNorm dw/db) ----------------
// Pass 1: grid (column blocks, row chunks); thread (c, chunk) sums its kColChunk rows in order.
// Pass 2: one thread per column adds the chunk partials in chunk order into out[c] (+=).

struct BiasTerm {
  const float* dy;
  __device__ float operator()(int64_t r, int64_t c, int64_t cols) const { return dy[r * cols + c]; }
};
struct RmsWeightTerm {  // dy * x * rstd
  const float *dy, *x, *rstd;
  __device__ float operator()(int64_t r, int64_t c, int64_t cols) const {
    const int64_t i = r * cols + c;
    return dy[i] * (x[i] * rstd[r]);
  }
};
struct LnWeightTerm {  // dy * (x - mean) * rstd
  const float *dy, *x, *mean, *rstd;
  __device__ float operator()(int64_t r, int64_t c, int64_t cols) const {
    const int64_t i = r * cols + c;
    return dy[i] * ((x[i] - mean[r]) * rstd[r]);
  }
};

template <class Term>
__global__ void col_partial_kernel(Term term, float* __restrict__ partial, int64_t rows, int64_t cols) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * kColChunk, r1 = r0 + kColChunk < rows ? r0 + kColChunk : rows;
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += term(r, c, cols);
  partial[blockIdx.y * cols + c] = acc;
}
__global__ void col_finish_kernel(const float* __restrict__ partial, int64_t chunks, float* __restrict__ out,
                                  int64_t cols) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.f;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + c];
  out[c] += acc;
}

// ---------------- LayerNorm (one block per row) ----------------

__global__ void layernorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, float* __restrict__ y, float* __restrict__ mean,
                                         float* __restrict__ rstd, int64_t cols, float eps) {
  __shared__ float sh[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) s += xr[c];
  const float m = block_sum(s, sh) / static_cast<float>(cols);
  float v = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) v += (xr[c] - m) * (xr[c] - m);
  const float var = block_sum(v, sh) / static_cast<float>(cols);
  const float rs = 1.0f / sqrtf(var + eps);
  float* yr = y + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) yr[c] = (xr[c] - m) * rs * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

__global__ void layernorm_backward_dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                             const float* __restrict__ w, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, float* __restrict__ dx, int64_t cols) {
  __shared__ float sh[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  const float* dyr = dy + r * cols;
  const float m = mean[r], s = rstd[r];
  float a = 0.f, bsum = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const float n = (xr[c] - m) * s, dn = dyr[c] * w[c];
    a += dn;
    bsum += dn * n;
  }
  const float mean_dn = block_sum(a, sh) / static_cast<float>(cols);
  const float mean_dn_n = block_sum(bsum, sh) / static_cast<float>(cols);
  float* dxr = dx + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const float n = (xr[c] - m) * s, dn = dyr[c] * w[c];
    dxr[c] += s * (dn - mean_dn - n * mean_dn_n);
  }
}

// ---------------- GELU (tanh approximation, same formula as the CPU backend) ----------------

__global__ void gelu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
  }
}
__global__ void gelu_backward_kernel(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dx,
                                     int64_t n) {
  const float k = 0.7978845608028654f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float t = tanhf(k * (v + 0.044715f * v * v * v));
    const float du = k * (1.0f + 3.0f * 0.044715f * v * v);
    dx[i] += dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

// ---------------- embedding ----------------

__global__ void embedding_forward_kernel(const float* __restrict__ wte, const float* __restrict__ wpe,
                                         const int32_t* __restrict__ tokens, float* __restrict__ out, int64_t BT,
                                         int64_t T, int64_t C) {
  const int64_t n = BT * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / C, c = i % C;
    out[i] = wte[static_cast<int64_t>(tokens[row]) * C + c] + (wpe ? wpe[(row % T) * C + c] : 0.0f);
  }
}
// dwpe[t, c] += dout[b*T + t, c] for b = 0..B-1 in order (the CPU's order for that element).
__global__ void embedding_backward_wpe_kernel(const float* __restrict__ dout, float* __restrict__ dwpe, int64_t B,
                                              int64_t T, int64_t C) {
  const int64_t n = T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += dout[b * T * C + i];
    dwpe[i] = acc;
  }
}
// Token rows grouped by id (embedding_index of runtime/ops.h, built on the host from the batch's
// host tokens; positions in increasing order within a group):
// dwte[ids[g], c] += dout[pos[k], c] for k in [start[g], start[g+1]) in order.
__global__ void embedding_backward_wte_kernel(const float* __restrict__ dout, const int32_t* __restrict__ ids,
                                              const int32_t* __restrict__ start, const int32_t* __restrict__ pos,
                                              float* __restrict__ dwte, int64_t groups, int64_t C) {
  const int64_t n = groups * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / C, c = i % C;
    float* e = dwte + static_cast<int64_t>(ids[g]) * C + c;
    float acc = *e;
    for (int32_t k = start[g]; k < start[g + 1]; ++k) acc += dout[static_cast<int64_t>(pos[k]) * C + c];
    *e = acc;
  }
}

// ---------------- attention softmax (one warp per row of probs [rows = B*H*T, T]) ----------------

// In place: row i of each [T, T] block holds q k^T; becomes softmax(scale * row[0..i]), zeros after i.
__global__ void causal_softmax_kernel(float* __restrict__ p, int64_t rows, int64_t T, float scale) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t i = row % T;
  float* r = p + row * T;
  float mx = -INFINITY;
  for (int64_t j = lane; j <= i; j += 32) mx = fmaxf(mx, r[j] * scale);
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t j = lane; j <= i; j += 32) {
    const float e = expf(r[j] * scale - mx);
    r[j] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int64_t j = lane; j <= i; j += 32) r[j] *= inv;
  for (int64_t j = i + 1 + lane; j < T; j += 32) r[j] = 0.f;
}
// In place on dp (= dout v^T): ds = p * (dp - sum_j p dp) * scale on the causal part, 0 elsewhere.
__global__ void causal_softmax_backward_kernel(const float* __restrict__ p, float* __restrict__ dp, int64_t rows,
                                               int64_t T, float scale) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t i = row % T;
  const float* pr = p + row * T;
  float* r = dp + row * T;
  float dot = 0.f;
  for (int64_t j = lane; j <= i; j += 32) dot += pr[j] * r[j];
  dot = warp_sum(dot);
  for (int64_t j = lane; j <= i; j += 32) r[j] = pr[j] * (r[j] - dot) * scale;
  for (int64_t j = i + 1 + lane; j < T; j += 32) r[j] = 0.f;
}

// ---------------- cross-entropy over a padded vocabulary (one block per row) ----------------

// Block-wide max of row[0..V) and sum of exp(row - max) (f64), for the softmax of one row.
__device__ void row_max_and_expsum(const float* row, int64_t V, float* shf, double* shd, float& mx, double& sum) {
  mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) mx = fmaxf(mx, row[j]);
  mx = block_max(mx, shf);
  sum = 0.0;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) sum += exp(static_cast<double>(row[j] - mx));
  sum = block_sum(sum, shd);
}

// One block per (sample, head): each thread takes causal pairs (i, j <= i) in a grid-stride walk of
// the T*T square, accumulates q_i . k_j in f32 in index order, and the block takes the max (exact,
// so the result does not depend on the thread split).
__global__ void attention_max_logits_kernel(const float* __restrict__ qkv, float* __restrict__ max_out, int64_t T,
                                            int64_t C, int64_t H, float scale) {
  const int64_t bh = blockIdx.x, d = C / H;
  const float* base = qkv + (bh / H) * T * 3 * C + (bh % H) * d;
  float mx = -INFINITY;
  for (int64_t p = threadIdx.x; p < T * T; p += blockDim.x) {
    const int64_t i = p / T, j = p % T;
    if (j > i) continue;
    const float* q = base + i * 3 * C;
    const float* k = base + j * 3 * C + C;
    float dot = 0.0f;
    for (int64_t e = 0; e < d; ++e) dot += q[e] * k[e];
    mx = fmaxf(mx, dot * scale);
  }
  __shared__ float red[kThreads];
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) max_out[bh] = red[0];
}

__global__ void cross_entropy_forward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ targets,
                                             float* __restrict__ losses, int64_t V, int64_t Vp) {
  __shared__ float shf[kThreads / 32];
  __shared__ double shd[kThreads / 32];
  const int64_t n = blockIdx.x;
  const float* row = logits + n * Vp;
  float mx;
  double sum;
  row_max_and_expsum(row, V, shf, shd, mx, sum);
  if (threadIdx.x == 0) losses[n] = static_cast<float>(log(sum) + mx - row[targets[n]]);
}
__global__ void cross_entropy_backward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ targets,
                                              float dloss, float* __restrict__ dlogits, int64_t V, int64_t Vp) {
  __shared__ float shf[kThreads / 32];
  __shared__ double shd[kThreads / 32];
  const int64_t n = blockIdx.x;
  const float* row = logits + n * Vp;
  float* drow = dlogits + n * Vp;
  float mx;
  double sum;
  row_max_and_expsum(row, V, shf, shd, mx, sum);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < V; j += kThreads) drow[j] += dloss * expf(row[j] - mx) * inv;
  __syncthreads();  // the thread that added into drow[target] is done
  if (threadIdx.x == 0) drow[targets[n]] -= dloss;
}

// ---------------- the backend ----------------

/// Grow-only device scratch buffer (contents undefined between uses).
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
  void* get(size_t need) {
    if (need <= bytes) return ptr;
    if (ptr) CUDA_CHECK(cudaFree(ptr));
    ptr = nullptr;
    bytes = 0;
    CUDA_CHECK(cudaMalloc(&ptr, need));
    bytes = need;
    return ptr;
  }
  template <class T>
  T* as(int64_t count) {
    return static_cast<T*>(get(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
  }
};

class CudaKernels final : public Kernels {
 public:
  const char* name() const override { return "cuda"; }

  void convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n) override {
    if (n <= 0) return;
    if (sdt == ddt) {
      CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(n * dtype_size(sdt)), cudaMemcpyDeviceToDevice));
    } else if (sdt == DType::f32 && ddt == DType::bf16) {
      f32_to_bf16_kernel<<<grid_for(n), kThreads>>>(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
      CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
    } else if (sdt == DType::bf16 && ddt == DType::f32) {
      bf16_to_f32_kernel<<<grid_for(n), kThreads>>>(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
      CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
    } else {
      throw std::invalid_argument(std::string("[convert] unsupported ") + dtype_name(sdt) + " -> " + dtype_name(ddt) +
                                  " on cuda");
    }
  }

  void fill(float* x, float value, int64_t n) override {
    if (n <= 0) return;
    fill_kernel<<<grid_for(n), kThreads>>>(x, value, n);
    CUDA_CHECK_LAUNCH("fill_kernel");
  }
  void axpy(float* y, const float* x, float alpha, int64_t n) override {
    if (n <= 0) return;
    axpy_kernel<<<grid_for(n), kThreads>>>(y, x, alpha, n);
    CUDA_CHECK_LAUNCH("axpy_kernel");
  }
  void add(float* out, const float* a, const float* b, int64_t n) override {
    if (n <= 0) return;
    add_kernel<<<grid_for(n), kThreads>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH("add_kernel");
  }
  void scale(float* x, float alpha, int64_t n) override {
    if (n <= 0) return;
    scale_kernel<<<grid_for(n), kThreads>>>(x, alpha, n);
    CUDA_CHECK_LAUNCH("scale_kernel");
  }

  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, const float* B, float beta,
            float* C) override {
    gemm_batched(ta, tb, M, N, K, alpha, A, ta ? M : K, 0, B, tb ? K : N, 0, beta, C, N, 0, 1);
  }
  void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B,
                 float beta, float* C) override {
    cuda_gemm::gemm_bf16(ta, tb, M, N, K, alpha, A, B, beta, C);
  }

  void add_bias(float* y, const float* b, int64_t rows, int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    add_bias_kernel<<<grid_for(rows * cols), kThreads>>>(y, b, rows, cols);
    CUDA_CHECK_LAUNCH("add_bias_kernel");
  }

  void bias_grad(float* db, const float* dy, int64_t rows, int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    column_sum(BiasTerm{dy}, db, rows, cols, s_a_);
  }

  void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t cols, float eps) override {
    if (rows <= 0 || cols <= 0) return;
    check_grid(rows, "layernorm_forward", "rows");
    layernorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(x, w, b, y, mean, rstd, cols, eps);
    CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  }

  void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, float* dw, float* db, int64_t rows, int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    if (dx) {
      check_grid(rows, "layernorm_backward", "rows");
      layernorm_backward_dx_kernel<<<static_cast<unsigned>(rows), kThreads>>>(dy, x, w, mean, rstd, dx, cols);
      CUDA_CHECK_LAUNCH("layernorm_backward_dx_kernel");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (dw) column_sum(LnWeightTerm{dy, x, mean, rstd}, dw, rows, cols, s_a_);
    if (db) column_sum(BiasTerm{dy}, db, rows, cols, s_b_);
  }

  void gelu_forward(const float* x, float* y, int64_t n) override {
    if (n <= 0) return;
    gelu_forward_kernel<<<grid_for(n), kThreads>>>(x, y, n);
    CUDA_CHECK_LAUNCH("gelu_forward_kernel");
  }
  void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) override {
    if (n <= 0) return;
    gelu_backward_kernel<<<grid_for(n), kThreads>>>(x, dy, dx, n);
    CUDA_CHECK_LAUNCH("gelu_backward_kernel");
  }

  void embedding_forward(const float* wte, const float* wpe, const int32_t* tokens, float* out, int64_t B, int64_t T,
                         int64_t C) override {
    if (B * T * C <= 0) return;
    embedding_forward_kernel<<<grid_for(B * T * C), kThreads>>>(wte, wpe, tokens, out, B * T, T, C);
    CUDA_CHECK_LAUNCH("embedding_forward_kernel");
  }

  // dwte from the index the batch brought (ids | start | positions): no device->host copy.
  void embedding_backward(const float* dout, const int32_t* /*tokens*/, const int32_t* index, int64_t index_numel,
                          float* dwte, float* dwpe, int64_t B, int64_t T, int64_t C) override {
    const int64_t BT = B * T;
    if (BT <= 0 || C <= 0) return;
    if (dwpe) {
      embedding_backward_wpe_kernel<<<grid_for(T * C), kThreads>>>(dout, dwpe, B, T, C);
      CUDA_CHECK_LAUNCH("embedding_backward_wpe_kernel");
    }
    if (!dwte) return;
    const int64_t groups = (index_numel - 1 - BT) / 2;  // index_numel = 2 * groups + 1 + BT
    if (!index || groups < 1 || groups > BT || 2 * groups + 1 + BT != index_numel)
      throw std::invalid_argument("[embedding_backward] CUDA needs the batch's embedding index (embedding_index, "
                                  "runtime/ops.h) of 2 * groups + 1 + B*T elements; got " +
                                  std::to_string(index_numel) + " elements for B*T = " + std::to_string(BT));
    embedding_backward_wte_kernel<<<grid_for(groups * C), kThreads>>>(dout, index, index + groups,
                                                                      index + 2 * groups + 1, dwte, groups, C);
    CUDA_CHECK_LAUNCH("embedding_backward_wte_kernel");
  }

  // Query head h = j*g + r uses key/value head j (g = H/Hkv): for each r, one strided batch over j.
  void gqa_attention_forward(const float* q, const float* k, const float* v, float* out, float* probs,
                             const AttentionDims& a) override {
    if (a.B <= 0 || a.T <= 0 || a.d <= 0) return;
    const int64_t T = a.T, H = a.H, d = a.d, g = a.H / a.Hkv, C = H * d;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (int64_t b = 0; b < a.B; ++b)  // scores[h] = q_h k_j^T  ([T, T], row stride T)
      for (int64_t r = 0; r < g; ++r)
        gemm_batched(false, true, T, T, d, 1.0f, q + b * T * a.ldq + r * d, a.ldq, g * d, k + b * T * a.ldkv, a.ldkv,
                     d, 0.0f, probs + (b * H + r) * T * T, T, g * T * T, a.Hkv);
    const int64_t rows = a.B * H * T;
    causal_softmax_kernel<<<grid_rows(rows), kThreads>>>(probs, rows, T, scale);
    CUDA_CHECK_LAUNCH("causal_softmax_kernel");
    for (int64_t b = 0; b < a.B; ++b)  // out_h = P_h v_j, written into columns h*d.. of out [T, C]
      for (int64_t r = 0; r < g; ++r)
        gemm_batched(false, false, T, d, T, 1.0f, probs + (b * H + r) * T * T, T, g * T * T, v + b * T * a.ldkv, a.ldkv,
                     d, 0.0f, out + b * T * C + r * d, C, g * d, a.Hkv);
  }

  void attention_max_logits(const float* qkv, float* max_out, int64_t B, int64_t T, int64_t C, int64_t H) override {
    if (B <= 0 || T <= 0 || C <= 0) return;
    if (H <= 0 || C % H != 0)
      throw std::invalid_argument("[attention_max_logits] C=" + std::to_string(C) + " not divisible by H=" +
                                  std::to_string(H));
    const float scale = 1.0f / std::sqrt(static_cast<float>(C / H));
    attention_max_logits_kernel<<<to_int(B * H, "attention_max_logits", "B*H"), kThreads>>>(qkv, max_out, T, C, H,
                                                                                           scale);
    CUDA_CHECK_LAUNCH("attention_max_logits_kernel");
  }

  // dk_j / dv_j add their g query heads in increasing order (r = 0..g-1), as the CPU backend.
  void gqa_attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* probs,
                              float* dq, float* dk, float* dv, const AttentionDims& a) override {
    if (a.B <= 0 || a.T <= 0 || a.d <= 0) return;
    const int64_t T = a.T, H = a.H, d = a.d, g = a.H / a.Hkv, C = H * d, J = a.Hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::lock_guard<std::mutex> lock(mu_);
    float* ds = s_a_.as<float>(H * T * T);  // one sample's [H, T, T] score gradients at a time
    for (int64_t b = 0; b < a.B; ++b) {
      const float *qb = q + b * T * a.ldq, *kb = k + b * T * a.ldkv, *vb = v + b * T * a.ldkv, *dO = dout + b * T * C;
      const float* p = probs + b * H * T * T;
      float *dqb = dq + b * T * a.ldq, *dkb = dk + b * T * a.ldkv, *dvb = dv + b * T * a.ldkv;
      for (int64_t r = 0; r < g; ++r) {
        // dP_h = dO_h v_j^T ; dv_j += P_h^T dO_h
        gemm_batched(false, true, T, T, d, 1.0f, dO + r * d, C, g * d, vb, a.ldkv, d, 0.0f, ds + r * T * T, T, g * T * T, J);
        gemm_batched(true, false, T, d, T, 1.0f, p + r * T * T, T, g * T * T, dO + r * d, C, g * d, 1.0f, dvb, a.ldkv, d, J);
      }
      causal_softmax_backward_kernel<<<grid_rows(H * T), kThreads>>>(p, ds, H * T, T, scale);
      CUDA_CHECK_LAUNCH("causal_softmax_backward_kernel");
      for (int64_t r = 0; r < g; ++r) {
        // dq_h += dS_h k_j ; dk_j += dS_h^T q_h
        gemm_batched(false, false, T, d, T, 1.0f, ds + r * T * T, T, g * T * T, kb, a.ldkv, d, 1.0f, dqb + r * d, a.ldq,
                     g * d, J);
        gemm_batched(true, false, T, d, T, 1.0f, ds + r * T * T, T, g * T * T, qb + r * d, a.ldq, g * d, 1.0f, dkb, a.ldkv,
                     d, J);
      }
    }
  }

  void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                               const AttentionDims& a) override {
    cuda_flash::forward(q, k, v, out, lse, {a.B, a.T, a.H, a.Hkv, a.d, a.ldq, a.ldkv});
  }
  void flash_attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                                const float* lse, float* dq, float* dk, float* dv, const AttentionDims& a) override {
    std::lock_guard<std::mutex> lock(mu_);
    float* rowdot = s_b_.as<float>(a.B * a.H * a.T);
    cuda_flash::backward(dout, q, k, v, out, lse, dq, dk, dv, rowdot, {a.B, a.T, a.H, a.Hkv, a.d, a.ldq, a.ldkv});
  }

  void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                       float eps) override {
    cuda_llama::rmsnorm_forward(x, w, y, rstd, rows, cols, eps);
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                        int64_t rows, int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    if (dx) cuda_llama::rmsnorm_backward_dx(dy, x, w, rstd, dx, rows, cols);
    std::lock_guard<std::mutex> lock(mu_);
    if (dw) column_sum(RmsWeightTerm{dy, x, rstd}, dw, rows, cols, s_a_);
  }
  void rope(const float* x, float* y, int64_t B, int64_t T, int64_t heads, int64_t d, float theta,
            bool transpose) override {
    cuda_llama::rope(x, y, B, T, heads, d, theta, transpose);
  }
  void swiglu_forward(const float* g, const float* u, float* y, int64_t n) override {
    cuda_llama::swiglu_forward(g, u, y, n);
  }
  void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) override {
    cuda_llama::swiglu_backward(g, u, dy, dg, du, n);
  }

  void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, int64_t N, int64_t V,
                             int64_t Vp) override {
    if (N <= 0) return;
    check_grid(N, "cross_entropy_forward", "N");
    cross_entropy_forward_kernel<<<static_cast<unsigned>(N), kThreads>>>(logits, targets, losses, V, Vp);
    CUDA_CHECK_LAUNCH("cross_entropy_forward_kernel");
  }

  void cross_entropy_backward(const float* logits, const int32_t* targets, float dloss, float* dlogits, int64_t N,
                              int64_t V, int64_t Vp) override {
    if (N <= 0) return;
    check_grid(N, "cross_entropy_backward", "N");
    cross_entropy_backward_kernel<<<static_cast<unsigned>(N), kThreads>>>(logits, targets, dloss, dlogits, V, Vp);
    CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
  }

 private:
  cublasHandle_t handle() { return static_cast<cublasHandle_t>(cuda::cublas_handle()); }

  // Row-major, strided-batched: C_i[M,N] = alpha op(A_i) op(B_i) + beta C_i with row strides lda/ldb/ldc.
  // A row-major [r, c] with row stride ld is the column-major [c, r] matrix with leading dimension ld,
  // so the row-major product C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T.
  void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    int64_t sA, const float* B, int64_t ldb, int64_t sB, float beta, float* C, int64_t ldc, int64_t sC,
                    int64_t batch) {
    const char* op = "gemm";
    if (M < 0 || N < 0 || K < 0 || batch < 0)
      throw std::invalid_argument("[gemm] negative size M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                  " K=" + std::to_string(K));
    if (M == 0 || N == 0 || batch == 0) return;
    if (K == 0) {  // C = beta C (beta == 0 overwrites, even NaN)
      for (int64_t i = 0; i < batch; ++i)
        for (int64_t r = 0; r < M; ++r) {
          float* row = C + i * sC + r * ldc;
          if (beta == 0.f) CUDA_CHECK(cudaMemset(row, 0, static_cast<size_t>(N) * sizeof(float)));
          else if (beta != 1.f) scale(row, beta, N);
        }
      return;
    }
    const int m = to_int(N, op, "N"), n = to_int(M, op, "M"), k = to_int(K, op, "K");
    const int la = to_int(std::max<int64_t>(lda, 1), op, "lda"), lb = to_int(std::max<int64_t>(ldb, 1), op, "ldb"),
              lc = to_int(std::max<int64_t>(ldc, 1), op, "ldc");
    const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasHandle_t h = handle();
    if (batch == 1) {
      CUBLAS_CHECK(cublasSgemm(h, opb, opa, m, n, k, &alpha, B, lb, A, la, &beta, C, lc));
    } else {
      CUBLAS_CHECK(cublasSgemmStridedBatched(h, opb, opa, m, n, k, &alpha, B, lb, sB, A, la, sA, &beta, C, lc, sC,
                                             to_int(batch, op, "batch")));
    }
  }

  // out[c] += sum over rows of term(r, c), deterministic two-pass (see col_partial_kernel).
  template <class Term>
  void column_sum(Term term, float* out, int64_t rows, int64_t cols, Scratch& scratch) {
    const int64_t chunks = (rows + kColChunk - 1) / kColChunk;
    if (chunks > 65535) throw std::invalid_argument("[column_sum] rows=" + std::to_string(rows) + " too many");
    float* partial = scratch.as<float>(chunks * cols);
    const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
    col_partial_kernel<<<grid, kThreads>>>(term, partial, rows, cols);
    CUDA_CHECK_LAUNCH("col_partial_kernel");
    col_finish_kernel<<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads>>>(partial, chunks, out, cols);
    CUDA_CHECK_LAUNCH("col_finish_kernel");
  }

  static int grid_rows(int64_t rows) {  // one warp per row
    const int64_t per_block = kThreads / 32;
    const int64_t blocks = (rows + per_block - 1) / per_block;
    if (blocks > INT_MAX) throw std::invalid_argument("[attention] " + std::to_string(rows) + " rows exceed the grid");
    return static_cast<int>(blocks);
  }
  static void check_grid(int64_t rows, const char* op, const char* what) {
    if (rows > INT_MAX)
      throw std::invalid_argument(std::string("[") + op + "] " + what + "=" + std::to_string(rows) +
                                  " exceeds the grid limit " + std::to_string(INT_MAX));
  }
  std::mutex mu_;
  Scratch s_a_, s_b_;  // reduction partials / attention score gradients, LN db partials
};

}  // namespace

/// The process-wide CUDA backend (declared in kernels_cpu.cpp, returned by kernels(Device::CUDA)).
/// Created on first use and deliberately never destroyed: destroying the cuBLAS handle or freeing
/// scratch during static destruction can run after the CUDA runtime has shut down.
Kernels& cuda_kernels() {
  static CudaKernels* k = new CudaKernels();
  return *k;
}

}  // namespace mfsdp
