// The compute backend interface: raw f32 kernels on contiguous row-major buffers of one device.
//
// Device dispatch happens in one place: kernels(device) returns the CPU (Eigen + OpenMP) or the CUDA
// (cuBLAS + hand kernels) implementation; differentiable ops (ops.h) are written once against it.
// Conventions: "+=" in a comment means the kernel accumulates into its output (beta = 1);
// shapes are given in elements; all pointers live on the backend's device.
#pragma once
#include <cstdint>

#include "runtime/core/dtype.h"

namespace mfsdp {

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual const char* name() const = 0;

  // ---- elementwise / reductions ----
  virtual void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) = 0;
  virtual void fill(float* x, float value, int64_t n) = 0;
  /// y += alpha * x
  virtual void axpy(float* y, const float* x, float alpha, int64_t n) = 0;
  /// out = a + b
  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;
  virtual void scale(float* x, float alpha, int64_t n) = 0;

  // ---- GEMM ----
  /// C[M,N] = alpha * op(A) op(B) + beta * C, row-major; op(A) is [M,K] (A stored [K,M] when
  /// trans_a), op(B) is [K,N] (B stored [N,K] when trans_b).
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, const float* B, float beta, float* C) = 0;
  /// y[N,C] += b[C] broadcast over rows
  virtual void add_bias(float* y, const float* b, int64_t rows, int64_t cols) = 0;
  /// db[C] += sum over rows of dy[N,C]
  virtual void bias_grad(float* db, const float* dy, int64_t rows, int64_t cols) = 0;

  // ---- GPT building blocks ----
  /// y = (x - mean)/sqrt(var + eps) * w + b per row of C; saves mean[N], rstd[N].
  virtual void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                                 float* rstd, int64_t rows, int64_t cols, float eps) = 0;
  /// dx += ..., dw += ..., db += ... (any of dx/dw/db may be null).
  virtual void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                                  const float* rstd, float* dx, float* dw, float* db, int64_t rows,
                                  int64_t cols) = 0;
  /// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_forward(const float* x, float* y, int64_t n) = 0;
  /// dx += gelu'(x) * dy
  virtual void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) = 0;
  /// out[B*T, C] = wte[tok] + wpe[t]; tokens are int32 on this device.
  virtual void embedding_forward(const float* wte, const float* wpe, const int32_t* tokens, float* out,
                                 int64_t B, int64_t T, int64_t C) = 0;
  /// dwte[tok] += dout, dwpe[t] += dout (either may be null). Deterministic order.
  virtual void embedding_backward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe,
                                  int64_t B, int64_t T, int64_t C) = 0;
  /// Causal multi-head self-attention. qkv [B,T,3C] (q|k|v, heads of C/H); out [B,T,C];
  /// probs [B,H,T,T] softmax(q k^T / sqrt(C/H)) with the causal mask, saved for backward.
  virtual void attention_forward(const float* qkv, float* out, float* probs, int64_t B, int64_t T,
                                 int64_t C, int64_t H) = 0;
  /// QK-Clip's statistic (MuonClip, Kimi K2, arXiv 2507.20534): max_out[b*H + h] = the largest
  /// pre-softmax logit q_i . k_j / sqrt(C/H) of head h in sample b over the causal window j <= i.
  /// qkv [B,T,3C] as attention_forward; max_out [B,H]. Each dot product is accumulated in f32 in
  /// index order, so the values do not depend on B or on the launch shape.
  virtual void attention_max_logits(const float* qkv, float* max_out, int64_t B, int64_t T, int64_t C,
                                    int64_t H) = 0;
  /// dqkv += d(out)/d(qkv)^T dout
  virtual void attention_backward(const float* dout, const float* qkv, const float* probs, float* dqkv,
                                  int64_t B, int64_t T, int64_t C, int64_t H) = 0;
  /// losses[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]; columns V..Vp-1 are padding.
  virtual void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses,
                                     int64_t N, int64_t V, int64_t Vp) = 0;
  /// dlogits[n, :] += dloss * (softmax(logits[n, :V]) - onehot(target)); padding columns get 0.
  virtual void cross_entropy_backward(const float* logits, const int32_t* targets, float dloss,
                                      float* dlogits, int64_t N, int64_t V, int64_t Vp) = 0;
};

/// The backend for `device`. Throws std::runtime_error for CUDA when built without CUDA.
Kernels& kernels(Device device);

/// Number of threads CPU kernels use (OpenMP); set_cpu_threads(n) changes it for the process.
int cpu_threads();
void set_cpu_threads(int n);

}  // namespace mfsdp
