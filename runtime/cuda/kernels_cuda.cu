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
#include "runtime/cuda/cudnn_attention.h"
#include "runtime/cuda/gemm_bf16.h"
#include "runtime/cuda/gpt_kernels.cuh"
#include "runtime/cuda/flash_attention.h"
#include "runtime/cuda/llama_kernels.h"
#include "runtime/cuda/moe_kernels.h"
#include "runtime/kernels.h"

namespace mfsdp {
namespace {

using namespace cuda_detail;

int to_int(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string("[") + op + "] " + what + "=" + std::to_string(v) +
                                " outside the int range cuBLAS accepts");
  return static_cast<int>(v);
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
  bool gemm_bf16_epilogue(Epilogue e, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A, const void* B,
                          float* C, float* bias, float* aux) override {
    return cuda_gemm::gemm_bf16_epilogue(e, ta, tb, M, N, K, A, B, C, bias, aux);
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
  bool layernorm_forward_bf16(const float* x, const float* w, const float* b, uint16_t* y, float* mean, float* rstd,
                              int64_t rows, int64_t cols, float eps) override {
    if (rows <= 0 || cols <= 0) return true;
    check_grid(rows, "layernorm_forward_bf16", "rows");
    layernorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(x, w, b, y, mean, rstd, cols, eps);
    CUDA_CHECK_LAUNCH("layernorm_forward_kernel<bf16>");
    return true;
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

  void cudnn_attention_forward(const float* q, const float* k, const float* v, uint16_t* out, float* lse,
                               const AttentionDims& a) override {
    if (a.B <= 0 || a.T <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const CudnnBuffers s = cudnn_buffers(a, false);
    rows_to_bf16(q, a.ldq, s.q, a.B * a.T, a.H * a.d);
    rows_to_bf16(k, a.ldkv, s.k, a.B * a.T, a.Hkv * a.d);
    rows_to_bf16(v, a.ldkv, s.v, a.B * a.T, a.Hkv * a.d);
    cuda_cudnn::forward(s.q, s.k, s.v, out, lse, {a.B, a.T, a.H, a.Hkv, a.d}, cuda::compute_stream());
  }
  void cudnn_attention_backward(const float* dout, const float* q, const float* k, const float* v, const uint16_t* out,
                                const float* lse, float* dq, float* dk, float* dv, const AttentionDims& a) override {
    if (a.B <= 0 || a.T <= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    const CudnnBuffers s = cudnn_buffers(a, true);
    const int64_t rows = a.B * a.T, qc = a.H * a.d, kvc = a.Hkv * a.d;
    rows_to_bf16(q, a.ldq, s.q, rows, qc);
    rows_to_bf16(k, a.ldkv, s.k, rows, kvc);
    rows_to_bf16(v, a.ldkv, s.v, rows, kvc);
    rows_to_bf16(dout, qc, s.dout, rows, qc);
    cuda_cudnn::backward(s.q, s.k, s.v, out, s.dout, lse, s.dq, s.dk, s.dv, {a.B, a.T, a.H, a.Hkv, a.d},
                         cuda::compute_stream());
    add_bf16_rows(s.dq, dq, a.ldq, rows, qc);
    add_bf16_rows(s.dk, dk, a.ldkv, rows, kvc);
    add_bf16_rows(s.dv, dv, a.ldkv, rows, kvc);
  }

  void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                       float eps) override {
    cuda_llama::rmsnorm_forward(x, w, y, rstd, rows, cols, eps);
  }
  bool rmsnorm_forward_bf16(const float* x, const float* w, uint16_t* y, float* rstd, int64_t rows, int64_t cols,
                            float eps) override {
    cuda_llama::rmsnorm_forward(x, w, y, rstd, rows, cols, eps);
    return true;
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
  bool swiglu_forward_bf16(const float* g, const float* u, uint16_t* y, int64_t n) override {
    cuda_llama::swiglu_forward(g, u, y, n);
    return true;
  }
  void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) override {
    cuda_llama::swiglu_backward(g, u, dy, dg, du, n);
  }

  void gather_rows(const float* src, const int32_t* index, float* out, int64_t rows, int64_t cols) override {
    cuda_moe::gather_rows(src, index, out, rows, cols);
  }
  void combine_rows(const float* rows, const int32_t* row_of, const float* weight, float* y, int64_t N, int64_t K,
                    int64_t cols, bool accumulate) override {
    cuda_moe::combine_rows(rows, row_of, weight, y, N, K, cols, accumulate);
  }
  void combine_rows_backward(const float* dy, const int32_t* index, const float* weight, const float* rows,
                             float* drows, float* dweight, int64_t R, int64_t cols) override {
    cuda_moe::combine_rows_backward(dy, index, weight, rows, drows, dweight, R, cols);
  }
  void gated_add_rows(const float* x, float* gate, float* y, int64_t N, int64_t cols) override {
    cuda_moe::gated_add_rows(x, gate, y, N, cols);
  }
  void gated_add_rows_backward(const float* dy, const float* x, const float* gate, float* dx, float* dlogit, int64_t N,
                               int64_t cols) override {
    cuda_moe::gated_add_rows_backward(dy, x, gate, dx, dlogit, N, cols);
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

  void cross_entropy_fused(float* logits, const int32_t* targets, float* losses, float dloss, bool grad, int64_t N,
                           int64_t V, int64_t Vp) override {
    if (N <= 0) return;
    check_grid(N, "cross_entropy_fused", "N");
    cross_entropy_fused_kernel<<<static_cast<unsigned>(N), kThreads>>>(logits, targets, losses, dloss, grad, V, Vp);
    CUDA_CHECK_LAUNCH("cross_entropy_fused_kernel");
  }

  void sum_to_scalar(const float* x, int64_t n, double divisor, float* out) override {
    sum_to_scalar_kernel<<<1, kThreads>>>(x, n, divisor, out);
    CUDA_CHECK_LAUNCH("sum_to_scalar_kernel");
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
  // bf16 operands and gradients of the cuDNN attention, [B,T,heads,d] each, in one grow-only buffer
  // (the output is the caller's tensor).
  struct CudnnBuffers {
    uint16_t *q, *k, *v, *dout, *dq, *dk, *dv;
  };
  CudnnBuffers cudnn_buffers(const AttentionDims& a, bool backward) {
    const int64_t align = 128;  // elements: every buffer starts 256-byte aligned
    const int64_t nq = (a.B * a.T * a.H * a.d + align - 1) / align * align;
    const int64_t nkv = (a.B * a.T * a.Hkv * a.d + align - 1) / align * align;
    uint16_t* p = s_cudnn_.as<uint16_t>(nq + 2 * nkv + (backward ? 2 * (nq + nkv) : 0));
    CudnnBuffers b{};
    b.q = p, b.k = p + nq, b.v = p + nq + nkv;
    if (backward) {
      uint16_t* g = p + nq + 2 * nkv;
      b.dout = g, b.dq = g + nq, b.dk = g + 2 * nq, b.dv = g + 2 * nq + nkv;
    }
    return b;
  }
  static void rows_to_bf16(const float* src, int64_t ld, uint16_t* dst, int64_t rows, int64_t cols) {
    rows_to_bf16_kernel<<<grid_for(rows * cols), kThreads>>>(src, ld, dst, rows, cols);
    CUDA_CHECK_LAUNCH("rows_to_bf16_kernel");
  }
  static void add_bf16_rows(const uint16_t* src, float* dst, int64_t ld, int64_t rows, int64_t cols) {
    add_bf16_rows_kernel<<<grid_for(rows * cols), kThreads>>>(src, dst, ld, rows, cols);
    CUDA_CHECK_LAUNCH("add_bf16_rows_kernel");
  }

  Scratch s_cudnn_;
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
