// GPT-2 built from runtime ops, split into FSDP units so the engine can run it unit by unit.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/gpt_spec.h"
#include "runtime/engine/unit_model.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// GPT-2 (Radford et al. 2019; layout of Hugging Face's GPT2Model): learned position embeddings,
/// pre-LN blocks (LayerNorm -> causal attention -> residual; LayerNorm -> GELU MLP 4x -> residual),
/// final LayerNorm, output head tied to wte or untied, vocabulary padded to a multiple of 64.
///
/// Parameters are not owned by the model: each name is bound to a tensor (a view into an FSDP
/// unit's gathered buffer, or into one local buffer via allocate_local()). Unit forward functions
/// read the bound tensors, so the engine decides what is resident.
class GPT : public UnitModel {
 public:
  explicit GPT(const GPTConfig& cfg);

  const GPTConfig& config() const { return cfg_; }
  const ParamInventory& inventory() const override { return inv_; }
  int head_unit() const { return cfg_.n_layer + 1; }

  /// Binds parameter `name` to `t` (shape must match the inventory). Throws on unknown names.
  void bind(const std::string& name, const Tensor& t) override;

  // ---- UnitModel: unit 0 = embed, 1..n_layer = block(u-1), n_layer+1 = head_loss ----
  /// {u}, plus the embedding unit for the head when the head is tied to wte.
  std::vector<int> units_needed_by(int u) const override;
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override;
  /// init_param(config(), spec, seed, out).
  void init_param(const ParamSpec& spec, uint64_t seed, float* out) const override { init_param(cfg_, spec, seed, out); }
  /// n_embd / n_head: the rows of one head in c_attn's q, k and v blocks.
  int64_t attention_head_dim() const override { return cfg_.n_embd / cfg_.n_head; }
  /// n_layer * n_head heads, layer-major; head h of layer l: rows [h d, (h+1) d) (query) and
  /// [C + h d, C + (h+1) d) (key) of h.l.attn.c_attn.weight and of h.l.attn.c_attn.bias.
  std::vector<AttentionHead> attention_heads() const override;
  void record_attention_logits(bool on) override;
  std::vector<float> take_attention_logit_maxima() override;
  /// The tensor bound to `name`; throws when unbound or unknown.
  const Tensor& param(const std::string& name) const;

  /// Allocates one flat parameter buffer and one flat gradient buffer on `device`, binds views of
  /// them (parameters require grad; gradients are preallocated views) and initializes from `seed`.
  void allocate_local(uint64_t seed, Device device = Device::CPU);
  /// The flat buffers of allocate_local() (undefined otherwise).
  const Tensor& local_params() const { return local_params_; }
  const Tensor& local_grads() const { return local_grads_; }

  // ---- unit forwards ----
  /// Unit 0: tokens i32 [B, T] -> x [B, T, C].
  Tensor embed(const Tensor& tokens) const;
  /// Unit 1+layer: x [B, T, C] -> x [B, T, C].
  Tensor block(int layer, const Tensor& x) const;
  /// Head unit: final LayerNorm and output projection, x [B, T, C] -> logits [B*T, Vp]
  /// (uses wte.weight when tied, so the engine must gather the embedding unit too).
  Tensor logits(const Tensor& x) const;
  /// Head unit with the loss: sum of token cross-entropies / divisor (divisor <= 0: mean).
  Tensor head_loss(const Tensor& x, const Tensor& targets, double divisor = 0) const;
  /// Whole model (every parameter bound): tokens i32 [B, T] -> logits [B*T, Vp].
  Tensor forward_logits(const Tensor& tokens) const;
  /// Whole model (every parameter bound): mean cross-entropy.
  Tensor forward_loss(const Tensor& tokens, const Tensor& targets) const;

  /// GPT-2 initialisation of one parameter's full logical value: weights
  /// N(0, init_std), residual projections (attn.c_proj, mlp.c_proj) N(0, init_std/sqrt(2*n_layer)),
  /// biases 0, LayerNorm gains 1, padded embedding rows 0. The values depend only on
  /// (seed, parameter name), so every rank produces the same tensor. out has spec.numel() floats.
  static void init_param(const GPTConfig& cfg, const ParamSpec& spec, uint64_t seed, float* out);

 private:
  GPTConfig cfg_;
  ParamInventory inv_;
  std::map<std::string, Tensor> params_;
  std::map<std::string, Shape> shapes_;
  Tensor local_params_, local_grads_;
  bool record_logits_ = false;
  mutable std::vector<float> logit_max_;  ///< [n_layer * n_head] since the last take
};

/// Samples `n` tokens after `prompt` with temperature and top-k (0 = all), using the whole model
/// (every parameter bound) on the host; deterministic for a seed. Context is cut to seq_len.
std::vector<int32_t> sample_tokens(const GPT& model, std::vector<int32_t> prompt, int n, float temperature,
                                   int top_k, uint64_t seed);

}  // namespace mfsdp
