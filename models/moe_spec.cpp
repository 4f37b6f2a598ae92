#include "models/moe_spec.h"

#include <stdexcept>
#include <string>

#include "models/gpt_spec.h"  // inventory_numel, palm_flops_per_token

namespace mfsdp {

void MoeConfig::validate() const {
  LlamaConfig::validate();
  auto fail = [](const std::string& field, const std::string& why) {
    throw std::invalid_argument("model." + field + ": " + why);
  };
  if (num_experts < 1) fail("num_experts", "must be >= 1, got " + std::to_string(num_experts));
  if (num_experts_per_tok < 1 || num_experts_per_tok > num_experts)
    fail("num_experts_per_tok", "must lie in [1, model.num_experts = " + std::to_string(num_experts) + "], got " +
                                    std::to_string(num_experts_per_tok));
  if (moe_intermediate_size < 1)
    fail("moe_intermediate_size", "must be >= 1, got " + std::to_string(moe_intermediate_size));
  if (shared_expert_intermediate_size < 0)
    fail("shared_expert_intermediate_size", "must be >= 0, got " + std::to_string(shared_expert_intermediate_size));
  if (!(router_aux_loss_coef >= 0))
    fail("router_aux_loss_coef", "must be >= 0, got " + std::to_string(router_aux_loss_coef));
  if (!(router_z_loss_coef >= 0)) fail("router_z_loss_coef", "must be >= 0, got " + std::to_string(router_z_loss_coef));
}

ParamInventory moe_inventory(const MoeConfig& cfg) {
  cfg.validate();
  const int64_t C = cfg.n_embd, E = cfg.num_experts, Im = cfg.moe_intermediate_size,
                Is = cfg.shared_expert_intermediate_size;
  const ParamRole router_role = cfg.router_on_muon ? ParamRole::matrix : ParamRole::router;
  ParamInventory inv;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamRole role, int unit, int expert = -1) {
    inv.params.push_back(ParamSpec{std::move(name), std::move(shape), role, unit, 1, expert});
  };
  append_llama_embedding(inv, cfg);
  for (int i = 0; i < cfg.n_layer; ++i) {
    const int u = 1 + i;
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
    append_llama_attention(inv, cfg, i);
    add(p + "gate.weight", {E, C}, router_role, u);
    for (int j = 0; j < cfg.num_experts; ++j) {
      const std::string e = p + "experts." + std::to_string(j) + ".";
      const int id = i * cfg.num_experts + j;
      add(e + "gate_proj.weight", {Im, C}, ParamRole::matrix, u, id);
      add(e + "up_proj.weight", {Im, C}, ParamRole::matrix, u, id);
      add(e + "down_proj.weight", {C, Im}, ParamRole::matrix, u, id);
    }
    if (Is > 0) {
      add(p + "shared_expert.gate_proj.weight", {Is, C}, ParamRole::matrix, u);
      add(p + "shared_expert.up_proj.weight", {Is, C}, ParamRole::matrix, u);
      add(p + "shared_expert.down_proj.weight", {C, Is}, ParamRole::matrix, u);
      add(p + "shared_expert_gate.weight", {1, C}, ParamRole::router, u);
    }
  }
  append_llama_head(inv, cfg);
  return inv;
}

bool hf_moe_is_mixtral(const MoeConfig& cfg) { return cfg.shared_expert_intermediate_size == 0 && cfg.norm_topk_prob; }

std::string hf_moe_layout_refusal(const MoeConfig& cfg) {
  if (cfg.shared_expert_intermediate_size > 0 || cfg.norm_topk_prob) return "";
  return "model.shared_expert_intermediate_size 0 with model.norm_topk_prob false: no Hugging Face class computes "
         "this model, so it cannot be exported or imported. Qwen2-MoE (Qwen2MoeForCausalLM) always has a shared "
         "expert (model.shared_expert_intermediate_size > 0); Mixtral (MixtralForCausalLM) has none but always "
         "renormalises the top-k routing weights (model.norm_topk_prob true)";
}

const char* hf_moe_layout_name(const MoeConfig& cfg) { return hf_moe_is_mixtral(cfg) ? "Mixtral" : "Qwen2-MoE"; }

int64_t MoeConfig::num_params() const { return inventory_numel(moe_inventory(*this)); }

int64_t MoeConfig::num_active_params() const {
  const int64_t per_expert = 3LL * n_embd * moe_intermediate_size;
  return num_params() - static_cast<int64_t>(n_layer) * (num_experts - num_experts_per_tok) * per_expert;
}

double MoeConfig::flops_per_token(int context) const {
  int64_t n_matmul = 0;
  for (const auto& p : moe_inventory(*this).params) {
    // The embedding lookup is free; it multiplies only as the tied head.
    if (p.role == ParamRole::norm || (p.role == ParamRole::embedding && !tie_embeddings)) continue;
    n_matmul += p.numel();
  }
  n_matmul -= static_cast<int64_t>(n_layer) * (num_experts - num_experts_per_tok) * 3LL * n_embd * moe_intermediate_size;
  return palm_flops_per_token(n_matmul, n_layer, n_embd, context);
}

}  // namespace mfsdp
