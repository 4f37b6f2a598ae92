// The Mixture-of-Experts family (Qwen2-MoE / Mixtral style) built from runtime ops, split into
// FSDP units like Llama: Llama attention with the MoE feed-forward (runtime/ops_moe.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/llama.h"
#include "models/moe_spec.h"
#include "models/sequential_model.h"
#include "runtime/ops_moe.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// Hugging Face's Qwen2MoeForCausalLM maths (every layer sparse): Llama's embedding, attention
/// half, final RMSNorm and head (models/llama.h), and in each layer
///   x += moe_feed_forward(post_attention_layernorm(x))
/// with top-k routing over num_experts SwiGLU experts and the optional shared expert behind its
/// sigmoid gate. The training objective is
///   cross-entropy + router_aux_loss_coef * mean_l aux_l + router_z_loss_coef * mean_l z_l
/// over the layers l, each layer's losses taken over one micro-batch's tokens (transformers pools
/// every layer's tokens into one load-balancing loss instead; the two agree for one layer). The
/// head unit returns the cross-entropy only (the loss a run logs, comparable with dense models);
/// the auxiliary terms enter through the MoE op's backward, and last_routing() reports them.
class MoeTransformer : public SequentialModel<MoeTransformer, MoeConfig> {
 public:
  explicit MoeTransformer(const MoeConfig& cfg);
  /// head_dim(): the features per head of q, k and v (the attention kernel's choice, resolve).
  int64_t attention_head_size() const override { return cfg_.head_dim(); }

  /// Block units get token_share = tokens / loss_divisor (1 for the mean, divisor <= 0), so the
  /// auxiliary losses enter a micro-batch's objective with the weight its cross-entropy has;
  /// the other units as SequentialModel.
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override;

  // ---- unit forwards ----
  /// Unit 0: tokens i32 [B, T<=seq_len] -> x [B, T, C] (llama_embed).
  Tensor embed(const Tensor& tokens, const Tensor& index = Tensor()) const;
  /// Unit 1+layer: x [B, T, C] -> x [B, T, C]; the layer's auxiliary losses count
  /// coef / n_layer * token_share in the objective.
  Tensor block(int layer, const Tensor& x, double token_share = 1.0) const;
  /// The layer's MoE feed-forward of h [..., C] (the post-attention normalised activations).
  Tensor feed_forward(int layer, const Tensor& h, double token_share) const;
  /// Head unit: logits [B*T, Vp] (llama_logits).
  Tensor logits(const Tensor& x) const;
  /// Head unit with the loss (llama_head_loss): sum of token cross-entropies / divisor.
  Tensor head_loss(const Tensor& x, const Tensor& targets, double divisor = 0) const;

  /// Expert parallelism (UnitModel): owner_of_expert is indexed by ParamSpec::expert
  /// (layer * num_experts + expert); with an exchange, each layer passes only its owned experts'
  /// weights to the op.
  void set_expert_exchange(const ExpertExchange* exchange, const std::vector<int>& owner_of_expert) override;
  /// Under expert parallelism, a block unit's MoE op on zero rows (it still runs its owned
  /// experts on the other ranks' rows); nothing otherwise.
  void forward_unit_without_rows(int u) const override;

  /// The routing of each layer's latest forward (auxiliary losses and tokens per expert).
  const std::vector<MoeRouting>& last_routing() const { return routing_; }
  /// (token, slot) assignments per layer and expert ([n_layer][num_experts]) summed over the
  /// forwards with grad mode on (training, not evaluation; with recompute the graph-building
  /// pass) since the previous call; then starts a new count.
  std::vector<std::vector<int64_t>> take_expert_counts();

  /// Initialisation as Llama::init_param (Qwen2-MoE's): matrices, routers and gates
  /// N(0, init_std), norms 1, padded vocabulary rows 0; a function of (seed, name) only.
  static void init_param(const MoeConfig& cfg, const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count,
                         float* out);

 private:
  ParamLookup lookup() const {
    return [this](const std::string& n) -> const Tensor& { return param(n); };
  }
  const ExpertExchange* exchange_ = nullptr;
  std::vector<int> owner_of_expert_;
  mutable std::vector<MoeRouting> routing_;
  mutable std::vector<std::vector<int64_t>> counts_;
};

}  // namespace mfsdp
