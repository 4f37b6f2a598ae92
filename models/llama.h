// Llama built from runtime ops, split into FSDP units so the engine can run it unit by unit.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/llama_spec.h"
#include "models/sequential_model.h"
#include "runtime/engine/unit_model.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// Llama (Touvron et al. 2023; the math of Hugging Face's LlamaForCausalLM): token embedding without
/// positions, pre-norm blocks (RMSNorm -> q/k/v projections, rotary embedding of q and k, causal
/// grouped-query attention, o projection -> residual; RMSNorm -> SwiGLU MLP -> residual), final
/// RMSNorm, untied (or tied) head, no biases, vocabulary padded to a multiple of 64. Binding, the
/// unit dispatch, allocate_local and the whole-model forwards come from SequentialModel.
/// A model's parameter by full name (the tensor bound to it), for the functions a family with
/// Llama's embedding, attention and head shares (models/moe.h).
using ParamLookup = std::function<const Tensor&(const std::string&)>;

/// Llama's unit 0: tokens i32 [B, T <= seq_len] -> model.embed_tokens rows [B, T, C] (`index` as
/// runtime/ops.h embedding's).
Tensor llama_embed(const LlamaConfig& cfg, const ParamLookup& param, const Tensor& tokens, const Tensor& index);
/// The attention half of Llama layer `layer`:
/// x + o_proj(causal_attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))) with
/// h = input_layernorm(x).
Tensor llama_attention_residual(const LlamaConfig& cfg, int layer, const ParamLookup& param, const Tensor& x);
/// Llama's head: model.norm then lm_head (or the tied embedding), x [B, T, C] -> logits [B*T, Vp].
Tensor llama_logits(const LlamaConfig& cfg, const ParamLookup& param, const Tensor& x);
/// The head with the loss by the fused classifier: sum of token cross-entropies / divisor
/// (divisor <= 0: mean).
Tensor llama_head_loss(const LlamaConfig& cfg, const ParamLookup& param, const Tensor& x, const Tensor& targets,
                       double divisor);

class Llama : public SequentialModel<Llama, LlamaConfig> {
 public:
  explicit Llama(const LlamaConfig& cfg) : SequentialModel(cfg, llama_inventory(cfg), "Llama") {}
  using SequentialModel::init_param;
  /// head_dim(): the features per head of q, k and v (the attention kernel's choice, resolve).
  int64_t attention_head_size() const override { return cfg_.head_dim(); }

  // ---- unit forwards ----
  /// Unit 0: tokens i32 [B, T<=seq_len] -> x [B, T, C]; `index` is embedding_index(tokens) on
  /// their device or undefined (runtime/ops.h embedding).
  Tensor embed(const Tensor& tokens, const Tensor& index = Tensor()) const;
  /// Unit 1+layer: x [B, T, C] -> x [B, T, C].
  Tensor block(int layer, const Tensor& x) const;
  /// Head unit: final RMSNorm and output projection, x [B, T, C] -> logits [B*T, Vp].
  Tensor logits(const Tensor& x) const;
  /// Head unit with the loss: sum of token cross-entropies / divisor (divisor <= 0: mean), by the
  /// fused classifier (runtime/ops.h classifier_loss: chunks of rows, no [B*T, Vp] logits).
  Tensor head_loss(const Tensor& x, const Tensor& targets, double divisor = 0) const;

  /// Hugging Face's Llama initialisation of elements [first, first + count) of one parameter's
  /// flattened value: matrices and embeddings N(0, init_std), RMSNorm gains 1, padded vocabulary
  /// rows 0; a function of (seed, name, element) only.
  static void init_param(const LlamaConfig& cfg, const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count,
                         float* out);

 private:
  ParamLookup lookup() const {
    return [this](const std::string& n) -> const Tensor& { return param(n); };
  }
};

}  // namespace mfsdp
