#include "models/moe_hf.h"

#include <stdexcept>
#include <string_view>
#include <utility>

#include "models/llama_hf.h"

namespace mfsdp {
namespace {

// Mixtral's names for the MoE block: model.layers.i.block_sparse_moe.gate.weight (the router) and
// ...block_sparse_moe.experts.j.w1 / w3 / w2 (gate, up and down projections); the rest as Llama.
std::string mixtral_name(const std::string& ours) {
  const size_t at = ours.find(".mlp.");
  if (at == std::string::npos) return ours;
  std::string rest = ours.substr(at + 5);
  for (const auto& [from, to] : {std::pair<std::string_view, std::string_view>{"gate_proj.weight", "w1.weight"},
                                 {"up_proj.weight", "w3.weight"},
                                 {"down_proj.weight", "w2.weight"}})
    if (rest.ends_with(from)) {
      rest = rest.substr(0, rest.size() - from.size()) + std::string(to);
      break;
    }
  return ours.substr(0, at) + ".block_sparse_moe." + rest;
}

HfDecoderFile moe_file(const MoeConfig& cfg) {
  if (const std::string why = hf_moe_layout_refusal(cfg); !why.empty()) throw std::invalid_argument(why);
  HfDecoderFile f;
  f.inventory = moe_inventory(cfg);
  f.base = cfg;
  if (!hf_moe_is_mixtral(cfg)) {
    f.family = "Qwen2-MoE";
    f.layout = "hf-qwen2-moe";
    f.config = hf_moe_config_json(cfg);
    const int64_t C = cfg.n_embd, KV = static_cast<int64_t>(cfg.n_kv_head) * cfg.head_dim();
    for (int i = 0; i < cfg.n_layer; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
      f.zero_tensors.push_back({p + "q_proj.bias", {C}});
      f.zero_tensors.push_back({p + "k_proj.bias", {KV}});
      f.zero_tensors.push_back({p + "v_proj.bias", {KV}});
    }
  } else {
    f.family = "Mixtral";
    f.layout = "hf-mixtral";
    f.config = hf_mixtral_config_json(cfg);
    f.file_name = mixtral_name;
  }
  f.config_mismatch = [cfg](const nlohmann::json& c) { return hf_moe_config_mismatch(c, cfg); };
  return f;
}

// Mixtral's config.json checks (model_type "mixtral"; MixtralConfig's defaults for absent fields).
std::string mixtral_config_mismatch(const nlohmann::json& config, const MoeConfig& cfg, const std::string& where) {
  if (std::string e = hf_llama_shared_mismatch(config, cfg, where); !e.empty()) return e;
  nlohmann::json c = config;
  const std::pair<const char*, int64_t> defaults[] = {{"num_local_experts", 8}, {"num_experts_per_tok", 2}, {"intermediate_size", 14336}};
  for (const auto& [key, value] : defaults)
    if (!c.contains(key) || c[key].is_null()) c[key] = value;
  if (std::string e = hf_int_mismatch(c,
                                      {{"num_local_experts", cfg.num_experts, "model.num_experts"},
                                       {"num_experts_per_tok", cfg.num_experts_per_tok, "model.num_experts_per_tok"},
                                       {"intermediate_size", cfg.moe_intermediate_size, "model.moe_intermediate_size"}},
                                      where);
      !e.empty())
    return e;
  if (config.contains("sliding_window") && !config["sliding_window"].is_null())
    return where + ": sliding_window " + config["sliding_window"].dump() + " is not supported (full causal attention only)";
  return "";
}

}  // namespace

nlohmann::json hf_moe_config_json(const MoeConfig& cfg) {
  nlohmann::json j = hf_decoder_config_json(cfg, "Qwen2MoeForCausalLM", "qwen2_moe", cfg.shared_expert_intermediate_size);
  j["rope_scaling"] = nullptr;
  j["use_sliding_window"] = false;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = nlohmann::json::array();
  j["num_experts"] = cfg.num_experts;
  j["num_experts_per_tok"] = cfg.num_experts_per_tok;
  j["moe_intermediate_size"] = cfg.moe_intermediate_size;
  j["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size;
  j["norm_topk_prob"] = cfg.norm_topk_prob;
  j["router_aux_loss_coef"] = cfg.router_aux_loss_coef;
  return j;
}

nlohmann::json hf_mixtral_config_json(const MoeConfig& cfg) {
  nlohmann::json j = hf_decoder_config_json(cfg, "MixtralForCausalLM", "mixtral", cfg.moe_intermediate_size);
  j["sliding_window"] = nullptr;
  j["num_local_experts"] = cfg.num_experts;
  j["num_experts_per_tok"] = cfg.num_experts_per_tok;
  j["router_aux_loss_coef"] = cfg.router_aux_loss_coef;
  j["output_router_logits"] = false;
  return j;
}

std::string hf_moe_config_mismatch(const nlohmann::json& config, const MoeConfig& cfg) {
  const std::string where = "config.json";
  const std::string type = hf_config_string(config, "model_type", "", where);
  const std::string want = hf_moe_is_mixtral(cfg) ? "mixtral" : "qwen2_moe";
  if (type != want)
    return where + ": model_type is \"" + type + "\", this model's Hugging Face layout is \"" + want + "\" (" +
           (want == "mixtral" ? "no shared expert, top-k weights renormalised" : "a shared expert") + ")";
  if (want == "mixtral") return mixtral_config_mismatch(config, cfg, where);
  if (std::string e = hf_llama_shared_mismatch(config, cfg, where); !e.empty()) return e;
  // transformers' Qwen2MoeConfig defaults for absent fields
  nlohmann::json c = config;
  const std::pair<const char*, int64_t> defaults[] = {{"num_experts", 60},
                                                     {"num_experts_per_tok", 4},
                                                     {"moe_intermediate_size", 1408},
                                                     {"shared_expert_intermediate_size", 5632}};
  for (const auto& [key, value] : defaults)
    if (!c.contains(key) || c[key].is_null()) c[key] = value;
  if (std::string e = hf_int_mismatch(
          c,
          {{"num_experts", cfg.num_experts, "model.num_experts"},
           {"num_experts_per_tok", cfg.num_experts_per_tok, "model.num_experts_per_tok"},
           {"moe_intermediate_size", cfg.moe_intermediate_size, "model.moe_intermediate_size"},
           {"shared_expert_intermediate_size", cfg.shared_expert_intermediate_size, "model.shared_expert_intermediate_size"}},
          where);
      !e.empty())
    return e;
  if (const int64_t step = hf_config_int(config, "decoder_sparse_step", 1, where); step != 1)
    return where + ": decoder_sparse_step is " + std::to_string(step) + "; only 1 (every layer sparse) is supported";
  const bool norm = hf_config_bool(config, "norm_topk_prob", false, where);
  if (norm != cfg.norm_topk_prob)
    return where + ": norm_topk_prob is " + (norm ? "true" : "false") + " but model.norm_topk_prob is " +
           (cfg.norm_topk_prob ? "true" : "false");
  if (config.contains("mlp_only_layers") && !config["mlp_only_layers"].is_null() && !config["mlp_only_layers"].empty())
    return where + ": mlp_only_layers " + config["mlp_only_layers"].dump() + " is not supported (every layer is sparse)";
  if (hf_config_bool(config, "use_sliding_window", false, where))
    return where + ": use_sliding_window is not supported (full causal attention only)";
  return "";
}

void export_hf_moe(const std::string& path, const MoeConfig& cfg, const ParamSource& params, DType dtype,
                   const std::map<std::string, std::string>& extra_metadata) {
  export_hf_decoder(path, moe_file(cfg), params, dtype, extra_metadata);
}

NamedTensors import_hf_moe(const std::string& path, const MoeConfig& cfg) {
  return import_hf_decoder(path, moe_file(cfg));
}

ParamReader open_hf_moe(const std::string& path, const MoeConfig& cfg) { return open_hf_decoder(path, moe_file(cfg)); }

}  // namespace mfsdp
