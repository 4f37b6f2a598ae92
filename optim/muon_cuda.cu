// CUDA Muon and AdamW (see optim_cuda.h). Layout notes: a row-major [m, n] buffer is the
// column-major [n, m] matrix cuBLAS sees, so with Xc = X^T (col-major, ld n):
//   A = X X^T          -> C[m,m] = Xc^T Xc            (gemm T,N; A is symmetric)
//   B = b*A + c*A A    -> C = c*Ac Ac + b*C, C = copy of A (Ac = A^T in col-major, so C = B^T -> B)
//   X' = a*X + B X     -> Yc[n,m] = Xc * Bc + a*Yc, Yc = copy of Xc (Bc = B^T, Xc Bc = (B X)^T)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optim/optim_cuda.h"
#include "runtime/core/cuda_check.h"

namespace mfsdp {

namespace {


constexpr int kThreads = 256;
constexpr int kTile = 32;

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, 1 << 20));
}

// ---- reductions (deterministic: fixed grid from n, fixed tree order) ----

__device__ double block_reduce_sum(double v) {
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  return sh[0];
}

__global__ void sumsq_partial_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ partial) {
  double acc = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const double v = x[i];
    acc += v * v;
  }
  const double s = block_reduce_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/// Sums `count` partials; writes the total and/or 1 / (sqrt(total) + eps).
__global__ void sumsq_finalize_kernel(const double* __restrict__ partial, int count, double* total,
                                      float* inv_norm, float eps) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partial[i];
  const double s = block_reduce_sum(acc);
  if (threadIdx.x == 0) {
    if (total) *total = s;
    if (inv_norm) *inv_norm = static_cast<float>(1.0 / (sqrt(s) + static_cast<double>(eps)));
  }
}

int partial_blocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + 4 * kThreads - 1) / (4 * kThreads), 1,
                                              MuonCudaWorkspace::kPartials));
}

// ---- conversions (tiled transpose when the iteration runs on X^T) ----

/// X[r, c] = bf16(U[r, c] * s) for row-major [rows, cols].
__global__ void normalize_kernel(const float* __restrict__ u, __nv_bfloat16* __restrict__ x, int64_t n,
                                 const float* __restrict__ inv_norm) {
  const float s = *inv_norm;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    x[i] = __float2bfloat16_rn(u[i] * s);
}

/// X[c, r] = bf16(U[r, c] * s): U row-major [rows, cols] -> X row-major [cols, rows].
__global__ void normalize_transpose_kernel(const float* __restrict__ u, __nv_bfloat16* __restrict__ x,
                                           int64_t rows, int64_t cols, const float* __restrict__ inv_norm) {
  __shared__ float tile[kTile][kTile + 1];
  const float s = *inv_norm;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile, r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = u[r * cols + c] * s;
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) x[c * rows + r] = __float2bfloat16_rn(tile[threadIdx.x][k]);
  }
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    out[i] = __bfloat162float(x[i]);
}

/// out[r, c] = X[c, r]: X row-major [cols, rows] (bf16) -> out row-major [rows, cols] (f32).
__global__ void bf16_transpose_to_f32_kernel(const __nv_bfloat16* __restrict__ x, float* __restrict__ out,
                                             int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = __bfloat162float(x[c * rows + r]);
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) out[r * cols + c] = tile[threadIdx.x][k];
  }
}

// ---- elementwise optimizer kernels ----

__global__ void momentum_kernel(const float* __restrict__ g, float* __restrict__ m, float* __restrict__ u,
                                int64_t n, float beta, float one_minus_beta, bool nesterov) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float gi = g[i];
    const float mi = beta * m[i] + one_minus_beta * gi;
    m[i] = mi;
    u[i] = nesterov ? one_minus_beta * gi + beta * mi : mi;
  }
}

__global__ void apply_update_kernel(float* __restrict__ w, const float* __restrict__ o, int64_t n, float decay,
                                    float step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    w[i] = w[i] * decay - step * o[i];
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, float b1, float omb1, float b2, float omb2,
                             float decay, float step_size, float inv_bc2_sqrt, float eps) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float gi = g[i];
    const float mi = b1 * m[i] + omb1 * gi;
    const float vi = b2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * inv_bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

/// Binds `stream` and host pointer mode to the handle for the scope, restoring the previous ones.
class CublasScope {
 public:
  CublasScope(cublasHandle_t h, cudaStream_t s) : h_(h) {
    CUBLAS_CHECK(cublasGetStream(h_, &old_stream_));
    CUBLAS_CHECK(cublasGetPointerMode(h_, &old_mode_));
    CUBLAS_CHECK(cublasSetStream(h_, s));
    CUBLAS_CHECK(cublasSetPointerMode(h_, CUBLAS_POINTER_MODE_HOST));
  }
  ~CublasScope() {
    cublasSetStream(h_, old_stream_);
    cublasSetPointerMode(h_, old_mode_);
  }
  CublasScope(const CublasScope&) = delete;
  CublasScope& operator=(const CublasScope&) = delete;

 private:
  cublasHandle_t h_;
  cudaStream_t old_stream_ = nullptr;
  cublasPointerMode_t old_mode_ = CUBLAS_POINTER_MODE_HOST;
};

void gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
               float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
               int64_t ldc) {
  CUBLAS_CHECK(cublasGemmEx(h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha,
                            A, CUDA_R_16BF, static_cast<int>(lda), B, CUDA_R_16BF, static_cast<int>(ldb), &beta,
                            C, CUDA_R_16BF, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_bf16_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                       int64_t k, float alpha, const void* A, int64_t lda, int64_t sa, const void* B, int64_t ldb,
                       int64_t sb, float beta, void* C, int64_t ldc, int64_t sc, int64_t batch) {
  if (batch == 1) {
    gemm_bf16(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                          &alpha, A, CUDA_R_16BF, static_cast<int>(lda), sa, B, CUDA_R_16BF,
                                          static_cast<int>(ldb), sb, &beta, C, CUDA_R_16BF, static_cast<int>(ldc), sc,
                                          static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/// Newton-Schulz of `batch` contiguous row-major [rows, cols] f32 matrices `in` (matrix i at
/// i*rows*cols) into `out`, using ws buffers x, y, a, b sized for the batch. Each matrix is
/// normalized by its own f32 norm; the iterations are one chain of strided-batched bf16 GEMMs
/// over the whole batch (a plain GEMM when batch is 1).
void newton_schulz_device(const float* in, float* out, int64_t batch, int64_t rows, int64_t cols, int steps,
                          cudaStream_t stream, cublasHandle_t handle, MuonCudaWorkspace& ws) {
  const int64_t numel = rows * cols;
  const bool transposed = rows > cols;
  const int64_t m = transposed ? cols : rows;
  const int64_t n = transposed ? rows : cols;
  auto* x = static_cast<__nv_bfloat16*>(ws.x);
  auto* y = static_cast<__nv_bfloat16*>(ws.y);

  const int pb = partial_blocks(numel);
  for (int64_t i = 0; i < batch; ++i) {  // per-matrix f32 norm, then the bf16 iterate X_i
    const float* u = in + i * numel;
    sumsq_partial_kernel<<<pb, kThreads, 0, stream>>>(u, numel, ws.partial);
    CUDA_CHECK_LAUNCH("sumsq_partial_kernel");
    sumsq_finalize_kernel<<<1, kThreads, 0, stream>>>(ws.partial, pb, nullptr, ws.inv_norm + i, kNewtonSchulzNormEps);
    CUDA_CHECK_LAUNCH("sumsq_finalize_kernel");
    if (transposed) {
      const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
      normalize_transpose_kernel<<<grid, dim3(kTile, 8), 0, stream>>>(u, x + i * numel, rows, cols, ws.inv_norm + i);
    } else {
      normalize_kernel<<<grid_for(numel), kThreads, 0, stream>>>(u, x + i * numel, numel, ws.inv_norm + i);
    }
    CUDA_CHECK_LAUNCH("normalize_kernel");
  }

  {
    CublasScope scope(handle, stream);
    const int64_t sx = m * n, sa = m * m;
    for (int it = 0; it < steps; ++it) {
      gemm_bf16_batched(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, m, n, 1.0f, x, n, sx, x, n, sx, 0.0f, ws.a, m, sa, batch);
      CUDA_CHECK(cudaMemcpyAsync(ws.b, ws.a, static_cast<size_t>(batch * sa) * 2, cudaMemcpyDeviceToDevice, stream));
      gemm_bf16_batched(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, kNewtonSchulzC, ws.a, m, sa, ws.a, m, sa,
                        kNewtonSchulzB, ws.b, m, sa, batch);
      CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<size_t>(batch * sx) * 2, cudaMemcpyDeviceToDevice, stream));
      gemm_bf16_batched(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, m, 1.0f, x, n, sx, ws.b, m, sa, kNewtonSchulzA, y, n,
                        sx, batch);
      std::swap(x, y);
    }
  }

  if (transposed) {
    const dim3 grid(static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>((cols + kTile - 1) / kTile));
    for (int64_t i = 0; i < batch; ++i)
      bf16_transpose_to_f32_kernel<<<grid, dim3(kTile, 8), 0, stream>>>(x + i * numel, out + i * numel, rows, cols);
  } else {
    bf16_to_f32_kernel<<<grid_for(batch * numel), kThreads, 0, stream>>>(x, out, batch * numel);
  }
  CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
}

void check_gemm_dims(const char* op, int64_t rows, int64_t cols) {
  if (rows > INT_MAX || cols > INT_MAX || rows * cols > (int64_t{1} << 40))
    throw std::invalid_argument(std::string("[") + op + "] matrix [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] exceeds cuBLAS int dimensions");
  // Tiled transposes index blockIdx.y by 32-row tiles: at most 65535 tiles.
  if ((std::max(rows, cols) + kTile - 1) / kTile > 65535)
    throw std::invalid_argument(std::string("[") + op + "] matrix [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] is too large for the transpose kernels");
}

}  // namespace

// ---- workspace ----

MuonCudaWorkspace::~MuonCudaWorkspace() { release(); }

void MuonCudaWorkspace::release() {
  for (void* p : {static_cast<void*>(update), x, y, a, b, static_cast<void*>(partial), static_cast<void*>(inv_norm)})
    if (p) cudaFree(p);
  update = nullptr;
  x = y = a = b = nullptr;
  partial = nullptr;
  inv_norm = nullptr;
  numel_ = mn_ = mm_ = bytes_ = batch_ = 0;
}

void MuonCudaWorkspace::reserve(int64_t rows, int64_t cols, int64_t batch) {
  const int64_t numel = batch * rows * cols;
  const int64_t small = std::min(rows, cols);
  const int64_t mm = batch * small * small;
  if (numel <= numel_ && mm <= mm_ && batch <= batch_ && partial != nullptr) return;
  const int64_t new_numel = std::max(numel, numel_), new_mm = std::max(mm, mm_), new_batch = std::max(batch, batch_);
  CUDA_CHECK(cudaDeviceSynchronize());  // old buffers may still be in use by queued work
  release();
  CUDA_CHECK(cudaMalloc(&update, static_cast<size_t>(new_numel) * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&x, static_cast<size_t>(new_numel) * 2));
  CUDA_CHECK(cudaMalloc(&y, static_cast<size_t>(new_numel) * 2));
  CUDA_CHECK(cudaMalloc(&a, static_cast<size_t>(std::max<int64_t>(new_mm, 1)) * 2));
  CUDA_CHECK(cudaMalloc(&b, static_cast<size_t>(std::max<int64_t>(new_mm, 1)) * 2));
  CUDA_CHECK(cudaMalloc(&partial, kPartials * sizeof(double)));
  CUDA_CHECK(cudaMalloc(&inv_norm, static_cast<size_t>(new_batch) * sizeof(float)));
  numel_ = mn_ = new_numel;
  mm_ = new_mm;
  batch_ = new_batch;
  bytes_ = new_numel * (4 + 2 + 2) + new_mm * 4 + kPartials * 8 + 4 * new_batch;
}

// ---- public entry points ----

void newton_schulz_cuda(const float* G, float* out, int64_t rows, int64_t cols, int steps, cudaStream_t stream,
                        cublasHandle_t handle, MuonCudaWorkspace* ws) {
  if (rows < 0 || cols < 0 || steps < 0)
    throw std::invalid_argument("[newton_schulz_cuda] bad shape [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] or steps " + std::to_string(steps));
  detail::count_newton_schulz_call();
  if (rows == 0 || cols == 0) return;
  if (G == nullptr || out == nullptr) throw std::invalid_argument("[newton_schulz_cuda] null buffer");
  check_gemm_dims("newton_schulz_cuda", rows, cols);
  MuonCudaWorkspace local;
  MuonCudaWorkspace& w = ws ? *ws : local;
  w.reserve(rows, cols);
  newton_schulz_device(G, out, 1, rows, cols, steps, stream, handle, w);
  if (!ws) CUDA_CHECK(cudaStreamSynchronize(stream));
}

void newton_schulz_batched_cuda(const float* G, float* out, int64_t batch, int64_t rows, int64_t cols, int steps,
                                cudaStream_t stream, cublasHandle_t handle, MuonCudaWorkspace* ws) {
  if (batch < 0 || rows < 0 || cols < 0 || steps < 0 || batch > INT_MAX)
    throw std::invalid_argument("[newton_schulz_batched_cuda] bad batch " + std::to_string(batch) + ", shape [" +
                                std::to_string(rows) + ", " + std::to_string(cols) + "] or steps " +
                                std::to_string(steps));
  for (int64_t i = 0; i < batch; ++i) detail::count_newton_schulz_call();
  if (batch == 0 || rows == 0 || cols == 0) return;
  if (G == nullptr || out == nullptr) throw std::invalid_argument("[newton_schulz_batched_cuda] null buffer");
  check_gemm_dims("newton_schulz_batched_cuda", rows, cols);
  MuonCudaWorkspace local;
  MuonCudaWorkspace& w = ws ? *ws : local;
  w.reserve(rows, cols, batch);
  newton_schulz_device(G, out, batch, rows, cols, steps, stream, handle, w);
  if (!ws) CUDA_CHECK(cudaStreamSynchronize(stream));
}

void muon_step_cuda(float* W, const float* G, float* M, int64_t rows, int64_t cols, double lr,
                    const MuonOptions& opt, int qkv_blocks, cudaStream_t stream, cublasHandle_t handle,
                    MuonCudaWorkspace* ws) {
  detail::validate_muon_options(opt, "muon_step_cuda");
  const int64_t blocks = detail::muon_block_count(rows, cols, opt, qkv_blocks, "muon_step_cuda");
  if (W == nullptr || G == nullptr || M == nullptr) throw std::invalid_argument("[muon_step_cuda] null W, G or M");
  if (!std::isfinite(lr)) throw std::invalid_argument("[muon_step_cuda] learning rate is not finite");
  check_gemm_dims("muon_step_cuda", rows, cols);
  MuonCudaWorkspace local;
  MuonCudaWorkspace& w = ws ? *ws : local;
  const int64_t brows = rows / blocks;
  w.reserve(rows, cols);
  w.reserve(brows, cols, blocks);  // before the momentum: a growing workspace drops w.update

  const int64_t numel = rows * cols;
  momentum_kernel<<<grid_for(numel), kThreads, 0, stream>>>(G, M, w.update, numel, static_cast<float>(opt.momentum),
                                                            static_cast<float>(1.0 - opt.momentum), opt.nesterov);
  CUDA_CHECK_LAUNCH("momentum_kernel");
  for (int64_t blk = 0; blk < blocks; ++blk) detail::count_newton_schulz_call();
  newton_schulz_device(w.update, w.update, blocks, brows, cols, opt.ns_steps, stream, handle, w);
  const double scale = muon_scale(brows, cols, opt.scale_rule);
  apply_update_kernel<<<grid_for(numel), kThreads, 0, stream>>>(
      W, w.update, numel, static_cast<float>(1.0 - lr * opt.weight_decay), static_cast<float>(lr * scale));
  CUDA_CHECK_LAUNCH("apply_update_kernel");
  if (!ws) CUDA_CHECK(cudaStreamSynchronize(stream));
}

void muon_momentum_cuda(const float* G, float* M, float* U, int64_t n, const MuonOptions& opt, cudaStream_t stream) {
  detail::validate_muon_options(opt, "muon_momentum_cuda");
  if (n <= 0) return;
  momentum_kernel<<<grid_for(n), kThreads, 0, stream>>>(G, M, U, n, static_cast<float>(opt.momentum),
                                                        static_cast<float>(1.0 - opt.momentum), opt.nesterov);
  CUDA_CHECK_LAUNCH("momentum_kernel");
}

void muon_apply_update_cuda(float* W, const float* O, int64_t n, double lr, double scale, double weight_decay,
                            cudaStream_t stream) {
  if (n <= 0) return;
  apply_update_kernel<<<grid_for(n), kThreads, 0, stream>>>(W, O, n, static_cast<float>(1.0 - lr * weight_decay),
                                                            static_cast<float>(lr * scale));
  CUDA_CHECK_LAUNCH("apply_update_kernel");
}

void adamw_step_cuda(float* p, const float* g, float* m, float* v, int64_t n, double lr, int64_t step,
                     const AdamWOptions& opt, cudaStream_t stream) {
  detail::validate_adamw(opt, lr, step, "adamw_step_cuda");
  if (n < 0) throw std::invalid_argument("[adamw_step_cuda] n " + std::to_string(n) + " is negative");
  if (n == 0) return;
  if (!p || !g || !m || !v) throw std::invalid_argument("[adamw_step_cuda] null p, g, m or v");
  const double bc1 = 1.0 - std::pow(opt.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(opt.beta2, static_cast<double>(step));
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      p, g, m, v, n, static_cast<float>(opt.beta1), static_cast<float>(1.0 - opt.beta1),
      static_cast<float>(opt.beta2), static_cast<float>(1.0 - opt.beta2),
      static_cast<float>(1.0 - lr * opt.weight_decay), static_cast<float>(lr / bc1),
      static_cast<float>(1.0 / std::sqrt(bc2)), static_cast<float>(opt.eps));
  CUDA_CHECK_LAUNCH("adamw_kernel");
}

}  // namespace mfsdp
