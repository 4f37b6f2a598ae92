// Llama built from runtime ops, split into FSDP units so the engine can run it unit by unit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/llama_spec.h"
#include "models/model_common.h"
#include "runtime/engine/unit_model.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// Llama (Touvron et al. 2023; the math of Hugging Face's LlamaForCausalLM): token embedding without
/// positions, pre-norm blocks (RMSNorm -> q/k/v projections, rotary embedding of q and k, causal
/// grouped-query attention, o projection -> residual; RMSNorm -> SwiGLU MLP -> residual), final
/// RMSNorm, untied (or tied) head, no biases, vocabulary padded to a multiple of 64.
///
/// Parameters are not owned by the model: each name is bound to a tensor (a view into an FSDP
/// unit's gathered buffer, or into one local buffer via allocate_local()).
class Llama : public UnitModel {
 public:
  explicit Llama(const LlamaConfig& cfg);

  const LlamaConfig& config() const { return cfg_; }
  const ParamInventory& inventory() const override { return inv_; }
  int head_unit() const { return cfg_.n_layer + 1; }

  /// Binds parameter `name` to `t` (shape must match the inventory). Throws on unknown names.
  void bind(const std::string& name, const Tensor& t) override { params_.bind(name, t); }
  /// The tensor bound to `name`; throws when unbound or unknown.
  const Tensor& param(const std::string& name) const { return params_.get(name); }

  // ---- UnitModel: unit 0 = embed, 1..n_layer = block(u-1), n_layer+1 = head_loss ----
  /// {u}, plus the embedding unit for the head when the head is tied to the embedding.
  std::vector<int> units_needed_by(int u) const override;
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override;
  void init_param(const ParamSpec& spec, uint64_t seed, float* out) const override { init_param(cfg_, spec, seed, out); }

  /// One flat parameter and gradient buffer on `device`, views bound, initialized from `seed`.
  void allocate_local(uint64_t seed, Device device = Device::CPU);
  const Tensor& local_params() const { return params_.local_params(); }
  const Tensor& local_grads() const { return params_.local_grads(); }

  // ---- unit forwards ----
  /// Unit 0: tokens i32 [B, T<=seq_len] -> x [B, T, C].
  Tensor embed(const Tensor& tokens) const;
  /// Unit 1+layer: x [B, T, C] -> x [B, T, C].
  Tensor block(int layer, const Tensor& x) const;
  /// Head unit: final RMSNorm and output projection, x [B, T, C] -> logits [B*T, Vp].
  Tensor logits(const Tensor& x) const;
  /// Head unit with the loss: sum of token cross-entropies / divisor (divisor <= 0: mean).
  Tensor head_loss(const Tensor& x, const Tensor& targets, double divisor = 0) const;
  /// Whole model (every parameter bound): tokens i32 [B, T] -> logits [B*T, Vp].
  Tensor forward_logits(const Tensor& tokens) const;
  /// Whole model (every parameter bound): mean cross-entropy.
  Tensor forward_loss(const Tensor& tokens, const Tensor& targets) const;

  /// Hugging Face's Llama initialisation of one parameter's full value: matrices and embeddings
  /// N(0, init_std), RMSNorm gains 1, padded vocabulary rows 0; a function of (seed, name) only.
  static void init_param(const LlamaConfig& cfg, const ParamSpec& spec, uint64_t seed, float* out);

 private:
  LlamaConfig cfg_;
  ParamInventory inv_;
  BoundParams params_;
};

/// Samples `n` tokens after `prompt` with temperature and top-k (0 = all) on the whole model (every
/// parameter bound); deterministic for a seed. Context is cut to seq_len.
std::vector<int32_t> sample_tokens(const Llama& model, std::vector<int32_t> prompt, int n, float temperature,
                                   int top_k, uint64_t seed);

}  // namespace mfsdp
