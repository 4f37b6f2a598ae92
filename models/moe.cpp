#include "models/moe.h"

#include "runtime/autograd.h"
#include "runtime/ops.h"

namespace mfsdp {

MoeTransformer::MoeTransformer(const MoeConfig& cfg)
    : SequentialModel(cfg, moe_inventory(cfg), "MoeTransformer"),
      routing_(cfg.n_layer),
      counts_(cfg.n_layer, std::vector<int64_t>(cfg.num_experts, 0)) {}

std::vector<std::vector<int64_t>> MoeTransformer::take_expert_counts() {
  std::vector<std::vector<int64_t>> out(cfg_.n_layer, std::vector<int64_t>(cfg_.num_experts, 0));
  std::swap(out, counts_);
  return out;
}

void MoeTransformer::set_expert_exchange(const ExpertExchange* exchange, const std::vector<int>& owner_of_expert) {
  check_arg(!exchange || owner_of_expert.size() == static_cast<size_t>(cfg_.n_layer) * cfg_.num_experts,
            "MoeTransformer", "expert parallelism: " + std::to_string(owner_of_expert.size()) + " owners for " +
                                  std::to_string(cfg_.n_layer * cfg_.num_experts) + " experts");
  exchange_ = exchange;
  owner_of_expert_ = exchange ? owner_of_expert : std::vector<int>{};
}

void MoeTransformer::init_param(const MoeConfig& cfg, const ParamSpec& spec, uint64_t seed, int64_t first,
                                int64_t count, float* out) {
  Llama::init_param(cfg, spec, seed, first, count, out);
}

Tensor MoeTransformer::forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const {
  if (u < 1 || u > cfg_.n_layer) return SequentialModel::forward_unit(u, x, batch, loss_divisor);
  const double share = loss_divisor > 0 ? static_cast<double>(batch.tokens.numel()) / loss_divisor : 1.0;
  return block(u - 1, x, share);
}

Tensor MoeTransformer::embed(const Tensor& tokens, const Tensor& index) const {
  return llama_embed(cfg_, lookup(), tokens, index);
}

Tensor MoeTransformer::block(int layer, const Tensor& x, double token_share) const {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  Tensor x1 = llama_attention_residual(cfg_, layer, lookup(), x);
  // the MoE op gathers rows of its f32 input (it runs f32 matmuls)
  Tensor h = rms_norm(x1, param(p + "post_attention_layernorm.weight"), static_cast<float>(cfg_.norm_eps));
  return add(x1, feed_forward(layer, h, token_share));
}

void MoeTransformer::forward_unit_without_rows(int u) const {
  if (!exchange_ || u < 1 || u > cfg_.n_layer) return;
  NoGradGuard no_grad;
  feed_forward(u - 1, Tensor::zeros({0, cfg_.n_embd}), 1.0);
}

Tensor MoeTransformer::feed_forward(int layer, const Tensor& h, double token_share) const {
  const std::string m = "model.layers." + std::to_string(layer) + ".mlp.";
  MoeOptions opt;
  if (exchange_) {
    opt.exchange = exchange_;
    const auto first = owner_of_expert_.begin() + static_cast<ptrdiff_t>(layer) * cfg_.num_experts;
    opt.expert_owner.assign(first, first + cfg_.num_experts);
  }
  std::vector<SwigluWeights> experts(cfg_.num_experts);  // under expert parallelism only the owned ones
  for (int j = 0; j < cfg_.num_experts; ++j) {
    if (exchange_ && opt.expert_owner[j] != exchange_->rank) continue;
    const std::string e = m + "experts." + std::to_string(j) + ".";
    experts[j] = {param(e + "gate_proj.weight"), param(e + "up_proj.weight"), param(e + "down_proj.weight")};
  }
  SwigluWeights shared;
  Tensor shared_gate;
  if (cfg_.shared_expert_intermediate_size > 0) {
    shared = {param(m + "shared_expert.gate_proj.weight"), param(m + "shared_expert.up_proj.weight"),
              param(m + "shared_expert.down_proj.weight")};
    shared_gate = param(m + "shared_expert_gate.weight");
  }
  opt.top_k = cfg_.num_experts_per_tok;
  opt.norm_topk_prob = cfg_.norm_topk_prob;
  opt.aux_loss_weight = cfg_.router_aux_loss_coef / cfg_.n_layer * token_share;
  opt.z_loss_weight = cfg_.router_z_loss_coef / cfg_.n_layer * token_share;
  MoeRouting routing;
  Tensor y = moe_feed_forward(h, param(m + "gate.weight"), experts, shared, shared_gate, opt, &routing);
  if (h.numel() == 0) return y;  // an exchange without rows of its own: no routing to report
  routing_.at(layer) = routing;
  if (grad_mode_enabled())
    for (int e = 0; e < cfg_.num_experts; ++e) counts_[layer][e] += routing.tokens_per_expert[e];
  return y;
}

Tensor MoeTransformer::logits(const Tensor& x) const { return llama_logits(cfg_, lookup(), x); }

Tensor MoeTransformer::head_loss(const Tensor& x, const Tensor& targets, double divisor) const {
  return llama_head_loss(cfg_, lookup(), x, targets, divisor);
}

}  // namespace mfsdp
