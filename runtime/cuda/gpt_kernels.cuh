// The hand-written kernels of the CUDA backend (elementwise, column reductions, LayerNorm, GELU,
// embedding, attention softmax, cross-entropy). Included by kernels_cuda.cu only: the backend
// launches them from that translation unit (no separable compilation), so they stay internal to it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_common.cuh"

namespace mfsdp {
namespace {

using namespace cuda_detail;

constexpr int64_t kColChunk = 64;    // rows per partial sum of the column reductions

// ---------------- elementwise ----------------

__device__ __forceinline__ float bf16_value(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
__global__ void f32_to_bf16_kernel(const float* __restrict__ s, uint16_t* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = bf16_bits(s[i]);
}
__global__ void bf16_to_f32_kernel(const uint16_t* __restrict__ s, float* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = bf16_value(s[i]);
}
// d[r*cols + c] = bf16(s[r*ld + c]) for rows x cols: strided f32 rows packed as contiguous bf16.
__global__ void rows_to_bf16_kernel(const float* __restrict__ s, int64_t ld, uint16_t* __restrict__ d, int64_t rows,
                                    int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = bf16_bits(s[(i / cols) * ld + i % cols]);
}
// d[r*ld + c] += f32(s[r*cols + c]): contiguous bf16 rows added into strided f32 rows.
__global__ void add_bf16_rows_kernel(const uint16_t* __restrict__ s, float* __restrict__ d, int64_t ld, int64_t rows,
                                     int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[(i / cols) * ld + i % cols] += bf16_value(s[i]);
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

// Out = float, or uint16_t for bf16 bits (the f32 result rounded as convert rounds it).
template <class Out>
__global__ void layernorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, Out* __restrict__ y, float* __restrict__ mean,
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
  Out* yr = y + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) store_as(yr + c, (xr[c] - m) * rs * w[c] + b[c]);
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
// The fused classifier's row pass, in place: the loss as cross_entropy_forward_kernel, then (grad)
// the row overwritten with what cross_entropy_backward_kernel adds into a zeroed dlogits.
__global__ void cross_entropy_fused_kernel(float* __restrict__ logits, const int32_t* __restrict__ targets,
                                           float* __restrict__ losses, float dloss, bool grad, int64_t V, int64_t Vp) {
  __shared__ float shf[kThreads / 32];
  __shared__ double shd[kThreads / 32];
  const int64_t n = blockIdx.x;
  float* row = logits + n * Vp;
  float mx;
  double sum;
  row_max_and_expsum(row, V, shf, shd, mx, sum);
  if (threadIdx.x == 0) losses[n] = static_cast<float>(log(sum) + mx - row[targets[n]]);
  if (!grad) return;
  __syncthreads();  // the target's logit is read before the row is overwritten
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = threadIdx.x; j < Vp; j += kThreads) row[j] = j < V ? dloss * expf(row[j] - mx) * inv : 0.0f;
  __syncthreads();
  if (threadIdx.x == 0) row[targets[n]] -= dloss;
}

// out[0] = (sum of x in f64) / divisor; one block: thread t sums x[t], x[t + kThreads], ... in
// order, then block_sum's fixed tree.
__global__ void sum_to_scalar_kernel(const float* __restrict__ x, int64_t n, double divisor, float* __restrict__ out) {
  __shared__ double sh[kThreads / 32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += x[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) out[0] = static_cast<float>(s / divisor);
}

}  // namespace
}  // namespace mfsdp
