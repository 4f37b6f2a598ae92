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
/// The attention half of Llama layer `layer`, shared with the MoE family (models/moe.h):
/// x + o_proj(causal_attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))) with
/// h = input_layernorm(x); `param(name)` returns the tensor bound to a parameter's full name.
Tensor llama_attention_residual(const LlamaConfig& cfg, int layer,
                                const std::function<const Tensor&(const std::string&)>& param, const Tensor& x);

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

  /// Hugging Face's Llama initialisation of one parameter's full value: matrices and embeddings
  /// N(0, init_std), RMSNorm gains 1, padded vocabulary rows 0; a function of (seed, name) only.
  static void init_param(const LlamaConfig& cfg, const ParamSpec& spec, uint64_t seed, float* out);

 private:
  /// The head's input and weight: norm(x) as [B*T, C] and embed_tokens (tied) or lm_head [Vp, C].
  Tensor head_hidden(const Tensor& x) const;
  const Tensor& head_weight() const;
};

}  // namespace mfsdp
