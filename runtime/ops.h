// Differentiable ops a GPT needs. Each op checks its arguments (throws std::invalid_argument
// "[op] ..." naming the shapes), runs the device's kernels (kernels.h), and records a Node whose
// backward adds into its inputs' gradients. Float tensors are f32, except the bf16 outputs an op
// writes on request for an input of bf16 GEMMs (out_dtype); gradients are f32; tokens are i32.
#pragma once
#include <vector>

#include "runtime/core/classifier_memory.h"  // classifier_chunk_rows: the chunking rule
#include "runtime/core/name_table.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// The dtype linear layers multiply in on this thread: f32 (the default) or bf16, where both GEMM
/// operands (x and W forward; dy with W or x backward) are rounded to bf16 and the products are
/// accumulated in f32 (torch.autocast(dtype=torch.bfloat16) semantics for matmuls; cuBLAS tensor
/// cores on CUDA). Everything else (norms, attention, softmax, losses) stays f32.
DType matmul_dtype();

/// Sets matmul_dtype() for this thread until the scope ends (f32 or bf16; throws
/// std::invalid_argument otherwise).
class MatmulDTypeScope {
 public:
  explicit MatmulDTypeScope(DType dt);
  ~MatmulDTypeScope();
  MatmulDTypeScope(const MatmulDTypeScope&) = delete;
  MatmulDTypeScope& operator=(const MatmulDTypeScope&) = delete;

 private:
  DType prev_;
};

/// How causal attention runs on this thread. `unfused` (the default and the reference) keeps the
/// probabilities [B, H, T, T] for backward; `fused` (flash attention, Kernels::flash_attention_*)
/// keeps only a log-sum-exp per query row [B, H, T] and recomputes the probabilities in backward.
/// Both give the same values up to f32 rounding (the sums run in another order). `cudnn` (CUDA
/// builds with cuDNN, Kernels::cudnn_attention_*) keeps what `fused` keeps and runs cuDNN's fused
/// attention in bf16 (operands rounded to bf16, f32 softmax and accumulation; head sizes 64 and
/// 128): values within bf16 rounding of the others.
enum class AttentionKernel { unfused, fused, cudnn };
/// The kernels' names: "unfused", "fused", "cudnn".
inline constexpr NameTable<AttentionKernel, 3> kAttentionKernelNames{
    {{{AttentionKernel::unfused, "unfused"}, {AttentionKernel::fused, "fused"}, {AttentionKernel::cudnn, "cudnn"}}}};
AttentionKernel attention_kernel();
/// True when this build has the cuDNN attention kernel (CUDA, libcudnn and the cuDNN frontend
/// headers were found at configure time; runtime/cuda/cudnn_attention.h).
bool cudnn_attention_built();

/// Sets attention_kernel() for this thread until the scope ends.
class AttentionKernelScope {
 public:
  explicit AttentionKernelScope(AttentionKernel k);
  ~AttentionKernelScope();
  AttentionKernelScope(const AttentionKernelScope&) = delete;
  AttentionKernelScope& operator=(const AttentionKernelScope&) = delete;

 private:
  AttentionKernel prev_;
};

/// y = x W^T + b. x [..., in], W [out, in] (PyTorch Linear convention), b [out] or undefined.
/// Returns [..., out]. The GEMMs run in matmul_dtype().
Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b = Tensor());
/// Elementwise a + b (same shape; the residual add).
Tensor add(const Tensor& a, const Tensor& b);
/// LayerNorm over the last dimension C: x [..., C], weight [C], bias [C], eps 1e-5 as GPT-2;
/// statistics and arithmetic in f32. `out_dtype` bf16 writes the output as bf16 (the bits of the
/// f32 output rounded, in one kernel where the backend has it), for an output that only feeds
/// bf16 GEMMs (linear, gelu_mlp, classifier_loss take it as their operand as is); its gradient is
/// f32. Throws std::invalid_argument on mismatched shapes or devices, or another out_dtype.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f,
                  DType out_dtype = DType::f32);
/// GELU, tanh approximation (Hendrycks & Gimpel 2016; GPT-2's "gelu_new").
Tensor gelu(const Tensor& x);
/// GPT-2's MLP, gelu(x W_fc^T + b_fc) W_proj^T + b_proj, as one op: x [..., in], W_fc [hidden,
/// in], b_fc [hidden], W_proj [out, hidden], b_proj [out] (biases may be undefined). Returns
/// [..., out]. The GEMMs run in matmul_dtype(); under bf16 matmuls the backend's fused epilogues
/// carry the biases, the GELU and, backward, GELU's gradient with c_fc's bias gradient, when it
/// offers them (Kernels::gemm_bf16_epilogue: cuBLASLt on CUDA). Otherwise the same kernels, in the
/// same order, as linear -> gelu -> linear, bit for bit. Keeps pre = x W_fc^T + b_fc (f32) and the
/// GEMM operands for the backward, not gelu(pre) in f32 under bf16 matmuls. Throws
/// std::invalid_argument on mismatched shapes, dtypes or devices.
Tensor gelu_mlp(const Tensor& x, const Tensor& W_fc, const Tensor& b_fc, const Tensor& W_proj, const Tensor& b_proj);
/// Token + position embedding: wte [Vp, C], wpe [Tmax, C] or undefined (token embedding only, as
/// Llama), tokens i32 [B, T] with T <= Tmax and ids < Vp (ids are checked on CPU; the engine
/// checks every batch on the host before it leaves it). Returns [B, T, C] = wte[tokens] + wpe[0..T).
/// `index`: embedding_index(tokens) on the tokens' device, which the CUDA backward needs; when it
/// is undefined for CUDA tokens that require a backward, it is built here from a host copy of the
/// tokens (one device->host copy; the engine brings it with the batch instead).
Tensor embedding(const Tensor& wte, const Tensor& wpe, const Tensor& tokens, const Tensor& index = Tensor());
/// The embedding backward's index of host tokens (any shape, i32 on the CPU): the positions
/// grouped by id, as i32 [ids (G) | start (G + 1) | positions (n)] where G is the number of
/// distinct ids, ids ascending, start[g] the first slot of id g's positions and each id's
/// positions increasing (the order the CPU backward adds them in). Returns a CPU tensor of
/// 2 G + 1 + n elements (empty tokens: undefined). Throws std::invalid_argument for non-i32 or
/// device tokens, or more than INT_MAX positions.
Tensor embedding_index(const Tensor& tokens);
/// embedding_index of n ids at `ids` (host memory), appended to `out`.
void append_embedding_index(const int32_t* ids, int64_t n, std::vector<int32_t>& out);
/// Causal multi-head self-attention on fused projections: qkv [B, T, 3C] laid out q|k|v with
/// n_head heads of C/n_head each; softmax(q k^T / sqrt(C/H)) v with a causal mask, computed by
/// attention_kernel(). Returns [B, T, C] in `out_dtype`: f32, or bf16 for an output that only feeds
/// bf16 GEMMs (the models' attention projection under bf16 matmuls). A bf16 output is the f32 one
/// rounded (unfused, fused: the backward reads the same saved tensors, so the gradients are those of
/// the f32 output) or cuDNN's own bf16 output (cudnn, whose f32 output is that one widened). Throws
/// std::invalid_argument on a bad shape or out_dtype.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, DType out_dtype = DType::f32);
/// Causal grouped-query attention (Ainslie et al. 2023) on separate projections: q [B, T, H*d],
/// k and v [B, T, Hkv*d] with H = n_head, Hkv = n_kv_head dividing n_head; query head h uses
/// key/value head h / (H/Hkv) (Hugging Face's repeat_kv). softmax(q k^T / sqrt(d)) v with a causal
/// mask, computed by attention_kernel(). Returns [B, T, H*d] in `out_dtype`, as
/// causal_self_attention. n_kv_head == n_head is plain multi-head attention.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t n_head, int64_t n_kv_head,
                        DType out_dtype = DType::f32);
/// RMSNorm over the last dimension (Zhang & Sennrich 2019; Hugging Face LlamaRMSNorm):
/// x [..., C], weight [C]; y = x / sqrt(mean(x^2) + eps) * weight, in f32; `out_dtype` as
/// layer_norm's.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-5f, DType out_dtype = DType::f32);
/// Rotary position embedding (Su et al. 2021) in Hugging Face's rotate_half convention, positions
/// 0..T-1: x [B, T, n_head*d] with d even; pair (i, i + d/2) of each head rotates by t / theta^(2i/d).
/// Returns the same shape.
Tensor rotary_embedding(const Tensor& x, int64_t n_head, float theta = 10000.0f);
/// SwiGLU gate (Shazeer 2020; Llama's MLP): silu(gate) * up, elementwise, same shapes; `out_dtype`
/// as layer_norm's (bf16 for the down projection's operand under bf16 matmuls).
Tensor swiglu(const Tensor& gate, const Tensor& up, DType out_dtype = DType::f32);
/// QK-Clip's per-head statistic (not differentiable, records nothing): the largest pre-softmax
/// logit q_i . k_j / sqrt(C/n_head) of each head over every sample and causal pair j <= i of
/// qkv [B, T, 3C] (the input of causal_self_attention). Returns n_head values on the host
/// (-inf when B or T is 0). Throws std::invalid_argument on a bad shape.
std::vector<float> attention_max_logits(const Tensor& qkv, int64_t n_head);
/// Fused softmax cross-entropy over a padded vocabulary: logits [N, Vp], targets i32 [N] < vocab_size.
/// Columns vocab_size..Vp-1 are padding and never receive probability. Returns a scalar:
/// sum of per-token losses / divisor (divisor <= 0 means N, i.e. the mean).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_size, double divisor = 0);

/// The fused classifier: LM head plus softmax cross-entropy, never holding more than one chunk of
/// logits. h [N, C] (the final norm's output), W [Vp, C] (lm_head or the tied embedding), targets
/// i32 [N] < vocab_size <= Vp; columns vocab_size..Vp-1 are padding. Returns the same scalar as
/// cross_entropy(linear(h, W), targets, vocab_size, divisor) (divisor <= 0 means N).
///
/// Rows run in chunks of `chunk_rows` (0: classifier_chunk_rows(Vp)). Per chunk, into one
/// [chunk, Vp] f32 buffer: logits = h_c W^T (the GEMM linear runs, in matmul_dtype()), each row's
/// log-sum-exp and loss in f32 with an f64 sum of exponentials (Kernels::cross_entropy_fused), and,
/// when h or W requires grad, the logits' gradient written over the logits in place,
/// (softmax - onehot) / divisor, then dh_c = dlogits W and dW += dlogits^T h_c (linear's backward
/// GEMMs, bf16 operands under a bf16 matmul_dtype()). The forward thus computes the gradients: the
/// logits' gradient needs the loss's upstream gradient, which is 1 whenever the loss is the root
/// of backward (every training step), so the op assumes 1, keeps dh [N, C] and dW [Vp, C] (f32)
/// and its backward only adds them into the gradients of h and W (no second GEMM over the
/// logits). An upstream gradient g != 1 reruns the chunk pass with the scale g / divisor, the
/// same bits as the unfused backward. Without grad (evaluation) only the loss is computed.
///
/// Numerics against the unfused path: the row pass is the same kernel on the same logits, so with
/// one chunk (N <= chunk rows) the logits, loss, dh and dW are bitwise those of linear +
/// cross_entropy. With several chunks the GEMMs see row blocks: a GEMM library may block the
/// inner (C or Vp) sums of a smaller M differently, and dW sums the N rows chunk by chunk (f32
/// partial sums added in chunk order), so those elements can differ in the last bits (each is a
/// reordered f32 sum). Deterministic for a fixed chunk size, device and thread count.
/// Memory: one [chunk, Vp] f32 buffer (plus its bf16 copy under bf16 matmuls), dh and dW; never
/// N * Vp. Throws std::invalid_argument naming the shapes or the first bad target (CPU targets).
Tensor classifier_loss(const Tensor& h, const Tensor& W, const Tensor& targets, int64_t vocab_size,
                       double divisor = 0, int64_t chunk_rows = 0);

/// i32 tensor from host values (token ids).
Tensor tokens_tensor(const std::vector<int32_t>& ids, const Shape& shape, Device device = Device::CPU);

}  // namespace mfsdp
