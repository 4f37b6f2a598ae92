// GPT-2 built from runtime ops, split into FSDP units so the engine can run it unit by unit.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/gpt_spec.h"
#include "models/sequential_model.h"
#include "runtime/engine/unit_model.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// GPT-2 (Radford et al. 2019; layout of Hugging Face's GPT2Model): learned position embeddings,
/// pre-LN blocks (LayerNorm -> causal attention -> residual; LayerNorm -> GELU MLP 4x -> residual),
/// final LayerNorm, output head tied to wte or untied, vocabulary padded to a multiple of 64.
/// Binding, the unit dispatch, allocate_local and the whole-model forwards come from
/// SequentialModel (sequential_model.h).
class GPT : public SequentialModel<GPT, GPTConfig> {
 public:
  explicit GPT(const GPTConfig& cfg) : SequentialModel(cfg, gpt_inventory(cfg), "GPT") {}
  using SequentialModel::init_param;

  // ---- attention heads (per-head Muon split, QK-Clip) ----
  /// n_embd / n_head: the rows of one head in c_attn's q, k and v blocks.
  int64_t attention_head_dim() const override { return cfg_.n_embd / cfg_.n_head; }
  /// n_layer * n_head heads, layer-major; head h of layer l: rows [h d, (h+1) d) (query) and
  /// [C + h d, C + (h+1) d) (key) of h.l.attn.c_attn.weight and of h.l.attn.c_attn.bias.
  std::vector<AttentionHead> attention_heads() const override;
  void record_attention_logits(bool on) override;
  std::vector<float> take_attention_logit_maxima() override;

  // ---- unit forwards ----
  /// Unit 0: tokens i32 [B, T<=seq_len] -> x [B, T, C]; `index` is embedding_index(tokens) on
  /// their device or undefined (runtime/ops.h embedding).
  Tensor embed(const Tensor& tokens, const Tensor& index = Tensor()) const;
  /// Unit 1+layer: x [B, T, C] -> x [B, T, C].
  Tensor block(int layer, const Tensor& x) const;
  /// Head unit: final LayerNorm and output projection, x [B, T, C] -> logits [B*T, Vp]
  /// (uses wte.weight when tied, so the engine must gather the embedding unit too).
  Tensor logits(const Tensor& x) const;
  /// Head unit with the loss: sum of token cross-entropies / divisor (divisor <= 0: mean), by the
  /// fused classifier (runtime/ops.h classifier_loss: chunks of rows, no [B*T, Vp] logits).
  Tensor head_loss(const Tensor& x, const Tensor& targets, double divisor = 0) const;

  /// GPT-2 initialisation of elements [first, first + count) of one parameter's flattened logical
  /// value: weights N(0, init_std), residual projections (attn.c_proj, mlp.c_proj)
  /// N(0, init_std/sqrt(2*n_layer)), biases 0, LayerNorm gains 1, padded embedding rows 0. The
  /// values depend only on (seed, parameter name, element), so every rank produces the same slice.
  static void init_param(const GPTConfig& cfg, const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count,
                         float* out);

 private:
  /// The head's input and weight: ln_f(x) as [B*T, C] and wte (tied) or lm_head [Vp, C].
  Tensor head_hidden(const Tensor& x) const;
  const Tensor& head_weight() const;

  bool record_logits_ = false;
  mutable std::vector<float> logit_max_;  ///< [n_layer * n_head] since the last take
};

}  // namespace mfsdp
