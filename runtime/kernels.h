// The compute backend interface: raw f32 kernels on contiguous row-major buffers of one device.
//
// Device dispatch happens in one place: kernels(device) returns the CPU (Eigen + OpenMP) or the CUDA
// (cuBLAS + hand kernels) implementation; differentiable ops (ops.h) are written once against it.
// Conventions: "+=" in a comment means the kernel accumulates into its output (beta = 1);
// shapes are given in elements; all pointers live on the backend's device.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

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
  /// The same with bf16 operands A and B (same layouts) and f32 accumulation and output: the
  /// mixed-precision GEMM (bf16 x bf16 products are exact in f32, so only the summation order
  /// differs between backends). CPU: widened to f32, then gemm; CUDA: cublasGemmEx with
  /// CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F (tensor cores).
  virtual void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const void* A, const void* B, float beta, float* C) = 0;
  /// What a fused GEMM epilogue applies to P = op(A) op(B) (row-major [M,N]) as the GEMM writes
  /// it, instead of separate passes:
  /// - bias:        C = P + bias[N] broadcast over rows;
  /// - bias_gelu:   aux = P + bias, C = gelu(aux) (tanh approximation; aux is kept for dgelu);
  /// - dgelu_bgrad: C = P * gelu'(aux), and bias[N] is written (not added) with the sums over
  ///   rows of C (the bias gradient of the layer whose output went through GELU).
  enum class Epilogue { bias, bias_gelu, dgelu_bgrad };
  /// C[M,N] (f32, overwritten: beta 0) = epilogue(op(A) op(B)) with bf16 A and B in gemm_bf16's
  /// layouts; `aux` is [M,N] f32 (written by bias_gelu, read by dgelu_bgrad). Returns false, having
  /// written nothing, when this backend has no fused epilogue for the shape: the caller then runs
  /// gemm_bf16 and the separate kernels. The default offers none; CUDA offers cuBLASLt's epilogues
  /// (CUBLASLT_EPILOGUE_BIAS, GELU_AUX_BIAS, DGELU_BGRAD) when its heuristic has an algorithm.
  virtual bool gemm_bf16_epilogue(Epilogue /*e*/, bool /*trans_a*/, bool /*trans_b*/, int64_t /*M*/, int64_t /*N*/,
                                  int64_t /*K*/, const void* /*A*/, const void* /*B*/, float* /*C*/,
                                  float* /*bias*/, float* /*aux*/) {
    return false;
  }
  /// y[N,C] += b[C] broadcast over rows
  virtual void add_bias(float* y, const float* b, int64_t rows, int64_t cols) = 0;
  /// db[C] += sum over rows of dy[N,C]
  virtual void bias_grad(float* db, const float* dy, int64_t rows, int64_t cols) = 0;

  // ---- GPT building blocks ----
  /// y = (x - mean)/sqrt(var + eps) * w + b per row of C; saves mean[N], rstd[N].
  virtual void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                                 float* rstd, int64_t rows, int64_t cols, float eps) = 0;
  /// layernorm_forward with y written as bf16 bits (round to nearest even, as convert), f32
  /// statistics: the bits of layernorm_forward followed by convert, in one pass. Returns false,
  /// writing nothing, when the backend offers no such kernel (the CPU: the op then runs those two).
  virtual bool layernorm_forward_bf16(const float* /*x*/, const float* /*w*/, const float* /*b*/, uint16_t* /*y*/,
                                      float* /*mean*/, float* /*rstd*/, int64_t /*rows*/, int64_t /*cols*/,
                                      float /*eps*/) {
    return false;
  }
  /// dx += ..., dw += ..., db += ... (any of dx/dw/db may be null).
  virtual void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                                  const float* rstd, float* dx, float* dw, float* db, int64_t rows,
                                  int64_t cols) = 0;
  /// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_forward(const float* x, float* y, int64_t n) = 0;
  /// dx += gelu'(x) * dy
  virtual void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) = 0;
  /// out[B*T, C] = wte[tok] + wpe[t] (wpe may be null: no position embedding); tokens are int32
  /// on this device.
  virtual void embedding_forward(const float* wte, const float* wpe, const int32_t* tokens, float* out,
                                 int64_t B, int64_t T, int64_t C) = 0;
  /// dwte[tok] += dout, dwpe[t] += dout (either may be null), each element in position order.
  /// `index` (`index_numel` i32 on this device) is embedding_index(tokens) of runtime/ops.h, the
  /// positions grouped by id: CUDA needs it for dwte (one thread per (id, column), adding its
  /// positions in order, with no host copy); the CPU ignores it (nullptr is fine there).
  virtual void embedding_backward(const float* dout, const int32_t* tokens, const int32_t* index,
                                  int64_t index_numel, float* dwte, float* dwpe, int64_t B, int64_t T,
                                  int64_t C) = 0;

  /// Causal multi-head self-attention on fused projections. qkv [B,T,3C] (q|k|v, heads of C/H);
  /// out [B,T,C]; probs [B,H,T,T] softmax(q k^T / sqrt(C/H)) with the causal mask, saved for
  /// backward. The H = Hkv case of gqa_attention_forward. Throws std::invalid_argument when H does
  /// not divide C.
  void attention_forward(const float* qkv, float* out, float* probs, int64_t B, int64_t T, int64_t C, int64_t H) {
    const AttentionDims a = fused_dims(B, T, C, H, "attention_forward");
    gqa_attention_forward(qkv, qkv + C, qkv + 2 * C, out, probs, a);
  }
  /// QK-Clip's statistic (MuonClip, Kimi K2, arXiv 2507.20534): max_out[b*H + h] = the largest
  /// pre-softmax logit q_i . k_j / sqrt(C/H) of head h in sample b over the causal window j <= i.
  /// qkv [B,T,3C] as attention_forward; max_out [B,H]. Each dot product is accumulated in f32 in
  /// index order, so the values do not depend on B or on the launch shape.
  virtual void attention_max_logits(const float* qkv, float* max_out, int64_t B, int64_t T, int64_t C,
                                    int64_t H) = 0;
  /// dqkv += d(out)/d(qkv)^T dout
  void attention_backward(const float* dout, const float* qkv, const float* probs, float* dqkv, int64_t B,
                          int64_t T, int64_t C, int64_t H) {
    const AttentionDims a = fused_dims(B, T, C, H, "attention_backward");
    gqa_attention_backward(dout, qkv, qkv + C, qkv + 2 * C, probs, dqkv, dqkv + C, dqkv + 2 * C, a);
  }

  /// Sizes of a causal grouped-query attention: B samples of T tokens, H query heads and Hkv key/value
  /// heads (Hkv divides H) of d features each. Row t of sample b of q starts at q + (b*T + t)*ldq
  /// (head h at columns h*d..h*d+d), of k and v at k/v + (b*T + t)*ldkv.
  struct AttentionDims {
    int64_t B, T, H, Hkv, d, ldq, ldkv;
  };
  /// Causal grouped-query attention (Ainslie et al. 2023): query head h attends with key/value head
  /// h / (H/Hkv) (Hugging Face's repeat_kv order). out [B,T,H*d] contiguous; probs [B,H,T,T] =
  /// softmax(q_h k^T / sqrt(d)) with the causal mask, saved for backward.
  virtual void gqa_attention_forward(const float* q, const float* k, const float* v, float* out, float* probs,
                                     const AttentionDims& a) = 0;
  /// dq += ..., dk += ..., dv += ... (strided like q, k, v). dk/dv of a shared head add the query
  /// heads of its group in increasing order (deterministic).
  virtual void gqa_attention_backward(const float* dout, const float* q, const float* k, const float* v,
                                      const float* probs, float* dq, float* dk, float* dv,
                                      const AttentionDims& a) = 0;
  /// Fused causal grouped-query attention (FlashAttention, Dao et al. 2022, and FlashAttention-2,
  /// Dao 2023): the output of gqa_attention_forward without materialising probabilities. lse
  /// [B,H,T] receives log(sum_{j<=i} exp(q_i.k_j / sqrt(d))) of each query row; with q, k, v and
  /// out it is all the backward needs. Memory is O(B H T) instead of O(B H T^2).
  virtual void flash_attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                                       const AttentionDims& a) = 0;
  /// dq += ..., dk += ..., dv += ... as gqa_attention_backward, the probabilities recomputed as
  /// exp(q_i.k_j / sqrt(d) - lse_i) and the softmax row sums taken as dout_i . out_i (out: the
  /// forward's output). Deterministic (no atomics; a shared head's query heads add in order).
  virtual void flash_attention_backward(const float* dout, const float* q, const float* k, const float* v,
                                        const float* out, const float* lse, float* dq, float* dk, float* dv,
                                        const AttentionDims& a) = 0;
  /// cuDNN's fused attention (CUDA builds with cuDNN, runtime/cuda/cudnn_attention.h) with the
  /// semantics of flash_attention_forward: out [B,T,H*d] (bf16 bits: cuDNN's output as it writes
  /// it) and lse [B,H,T] (f32) written, in bf16 precision: q, k and v are rounded to bf16 (round to
  /// nearest even), cuDNN multiplies in bf16 with f32 accumulation and softmax. Head sizes d = 64
  /// and 128 only. The base (CPU) version throws std::runtime_error; the CUDA backend throws
  /// std::invalid_argument for another head size and std::runtime_error when built without cuDNN
  /// or when cuDNN fails (naming the step).
  virtual void cudnn_attention_forward(const float* q, const float* k, const float* v, uint16_t* out, float* lse,
                                       const AttentionDims& a) {
    throw std::runtime_error(std::string("[cudnn_attention_forward] the ") + name() + " backend has no cuDNN attention");
  }
  /// dq += ..., dk += ..., dv += ... as flash_attention_backward, by cuDNN's deterministic
  /// backward from out and lse of cudnn_attention_forward: q, k, v and dout rounded to bf16, bf16
  /// gradients widened and added into the f32 dq, dk, dv.
  virtual void cudnn_attention_backward(const float* dout, const float* q, const float* k, const float* v,
                                        const uint16_t* out, const float* lse, float* dq, float* dk, float* dv,
                                        const AttentionDims& a) {
    throw std::runtime_error(std::string("[cudnn_attention_backward] the ") + name() + " backend has no cuDNN attention");
  }

  // ---- Llama building blocks ----
  /// RMSNorm (Zhang & Sennrich 2019; Hugging Face LlamaRMSNorm): y = x * rstd * w per row with
  /// rstd = 1/sqrt(mean(x^2) + eps); saves rstd[rows].
  virtual void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t cols,
                               float eps) = 0;
  /// rmsnorm_forward with y written as bf16 bits, as layernorm_forward_bf16 (false: not offered).
  virtual bool rmsnorm_forward_bf16(const float* /*x*/, const float* /*w*/, uint16_t* /*y*/, float* /*rstd*/,
                                    int64_t /*rows*/, int64_t /*cols*/, float /*eps*/) {
    return false;
  }
  /// dx += ..., dw += ... (either may be null).
  virtual void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                float* dw, int64_t rows, int64_t cols) = 0;
  /// Rotary position embedding (Su et al. 2021) in Hugging Face's rotate_half layout on x [B,T,heads*d]
  /// (d even, position t of each sample): with h = d/2, f_i = 1/theta^(2i/d) (f32 as HF computes it)
  /// and angle a = t*f_i, y[i] = x[i] cos a - x[i+h] sin a, y[i+h] = x[i+h] cos a + x[i] sin a.
  /// transpose = false: y = R x (overwrites y); transpose = true: y += R^T x (the backward).
  virtual void rope(const float* x, float* y, int64_t B, int64_t T, int64_t heads, int64_t d, float theta,
                    bool transpose) = 0;
  /// SwiGLU gate (Shazeer 2020): y = silu(g) * u = g * sigmoid(g) * u, elementwise over n.
  virtual void swiglu_forward(const float* g, const float* u, float* y, int64_t n) = 0;
  /// swiglu_forward with y written as bf16 bits, as layernorm_forward_bf16 (false: not offered).
  virtual bool swiglu_forward_bf16(const float* /*g*/, const float* /*u*/, uint16_t* /*y*/, int64_t /*n*/) {
    return false;
  }
  /// dg += dy * u * silu'(g), du += dy * silu(g) (either may be null).
  virtual void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n) = 0;

  // ---- mixture-of-experts rows (runtime/ops_moe.cpp): dispatch, combine, the shared expert's gate ----
  /// Dispatch: out[i, :] = src[index[i], :] for i < rows (rows of `cols` f32).
  virtual void gather_rows(const float* src, const int32_t* index, float* out, int64_t rows, int64_t cols) = 0;
  /// Combine, per token n < N: y[n, :] = (accumulate ? y[n, :] : 0) + the sum over j = 0..K-1, added in
  /// that order, of weight[n K + j] * rows[row_of[n K + j], :] (weight null: the rows themselves).
  virtual void combine_rows(const float* rows, const int32_t* row_of, const float* weight, float* y, int64_t N,
                            int64_t K, int64_t cols, bool accumulate) = 0;
  /// The combine's backward, per expert row i < R fed by token index[i] with weight[i]:
  /// drows[i, :] = weight[i] * dy[index[i], :] (overwritten) and dweight[i] = dy[index[i], :] . rows[i, :]
  /// (summed in f64, rounded to f32; CPU in column order, CUDA a fixed tree).
  virtual void combine_rows_backward(const float* dy, const int32_t* index, const float* weight, const float* rows,
                                     float* drows, float* dweight, int64_t R, int64_t cols) = 0;
  /// A sigmoid-gated add per row n < N: gate[n] = sigmoid(gate[n]) in place (a logit in, the gate
  /// out), then y[n, :] += gate[n] * x[n, :].
  virtual void gated_add_rows(const float* x, float* gate, float* y, int64_t N, int64_t cols) = 0;
  /// Its backward from the gates: dx[n, :] = gate[n] * dy[n, :] (overwritten) and
  /// dlogit[n] = f32(dy[n, :] . x[n, :]) * gate[n] * (1 - gate[n]) (the dot summed in f64).
  virtual void gated_add_rows_backward(const float* dy, const float* x, const float* gate, float* dx, float* dlogit,
                                       int64_t N, int64_t cols) = 0;

  /// losses[n] = logsumexp(logits[n, :V]) - logits[n, target[n]]; columns V..Vp-1 are padding.
  virtual void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses,
                                     int64_t N, int64_t V, int64_t Vp) = 0;
  /// dlogits[n, :] += dloss * (softmax(logits[n, :V]) - onehot(target)); padding columns get 0.
  virtual void cross_entropy_backward(const float* logits, const int32_t* targets, float dloss,
                                      float* dlogits, int64_t N, int64_t V, int64_t Vp) = 0;
  /// The fused classifier's row pass (ops.h classifier_loss) on one chunk of logits [N, Vp], in
  /// place: losses[n] as cross_entropy_forward; with `grad`, row n is then overwritten with
  /// dloss * (softmax(row[:V]) - onehot(target)) and its padding columns with 0, the same bits
  /// cross_entropy_backward adds into a zeroed dlogits (the log-sum-exp is computed once per row).
  virtual void cross_entropy_fused(float* logits, const int32_t* targets, float* losses, float dloss, bool grad,
                                   int64_t N, int64_t V, int64_t Vp) = 0;
  /// out[0] = (x[0] + ... + x[n-1]) / divisor rounded to f32, the sum in f64 (a loss's mean over its
  /// tokens, left on the device). CPU: in index order. CUDA: one block, each thread a fixed strided
  /// subset in order, then a fixed tree (deterministic, not the CPU's bits).
  virtual void sum_to_scalar(const float* x, int64_t n, double divisor, float* out) = 0;

 private:
  static AttentionDims fused_dims(int64_t B, int64_t T, int64_t C, int64_t H, const char* op) {
    if (H <= 0 || C % H != 0)
      throw std::invalid_argument(std::string("[") + op + "] C=" + std::to_string(C) + " not divisible by H=" +
                                  std::to_string(H));
    return AttentionDims{B, T, H, H, C / H, 3 * C, 3 * C};
  }
};

/// The backend for `device`. Throws std::runtime_error for CUDA when built without CUDA.
Kernels& kernels(Device device);

/// Number of threads CPU kernels use (OpenMP); set_cpu_threads(n) changes it for the process.
int cpu_threads();
void set_cpu_threads(int n);

}  // namespace mfsdp
