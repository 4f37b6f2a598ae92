#include "models/llama_spec.h"

#include <stdexcept>

#include "models/gpt_spec.h"  // inventory_numel, palm_flops_per_token

namespace mfsdp {

void LlamaConfig::validate() const {
  auto fail = [](const std::string& field, const std::string& why) {
    throw std::invalid_argument("model." + field + ": " + why);
  };
  validate_transformer_dims(n_layer, n_head, n_embd, seq_len, vocab_size);
  if (head_dim() % 2 != 0)
    fail("n_embd", "n_embd / n_head must be even for rotary embeddings, got " + std::to_string(head_dim()));
  if (n_kv_head < 1 || n_head % n_kv_head != 0)
    fail("n_kv_head", "must be >= 1 and divide n_head=" + std::to_string(n_head) + ", got " + std::to_string(n_kv_head));
  if (intermediate_size < 1) fail("intermediate_size", "must be >= 1, got " + std::to_string(intermediate_size));
  if (!(norm_eps > 0)) fail("norm_eps", "must be > 0, got " + std::to_string(norm_eps));
  if (!(rope_theta > 0)) fail("rope_theta", "must be > 0, got " + std::to_string(rope_theta));
}

namespace {
void add_param(ParamInventory& inv, std::string name, std::vector<int64_t> shape, ParamRole role, int unit) {
  inv.params.push_back(ParamSpec{std::move(name), std::move(shape), role, unit, 1});
}
}  // namespace

void append_llama_embedding(ParamInventory& inv, const LlamaConfig& cfg) {
  inv.unit_names.push_back("embedding");
  add_param(inv, "model.embed_tokens.weight", {cfg.padded_vocab_size(), cfg.n_embd}, ParamRole::embedding, 0);
}

void append_llama_attention(ParamInventory& inv, const LlamaConfig& cfg, int layer) {
  const int64_t C = cfg.n_embd, KV = static_cast<int64_t>(cfg.n_kv_head) * cfg.head_dim();
  const int u = 1 + layer;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  inv.unit_names.push_back("layers." + std::to_string(layer));
  add_param(inv, p + "input_layernorm.weight", {C}, ParamRole::norm, u);
  add_param(inv, p + "self_attn.q_proj.weight", {C, C}, ParamRole::matrix, u);
  add_param(inv, p + "self_attn.k_proj.weight", {KV, C}, ParamRole::matrix, u);
  add_param(inv, p + "self_attn.v_proj.weight", {KV, C}, ParamRole::matrix, u);
  add_param(inv, p + "self_attn.o_proj.weight", {C, C}, ParamRole::matrix, u);
  add_param(inv, p + "post_attention_layernorm.weight", {C}, ParamRole::norm, u);
}

void append_llama_head(ParamInventory& inv, const LlamaConfig& cfg) {
  const int head = cfg.n_layer + 1;
  inv.unit_names.push_back("head");
  add_param(inv, "model.norm.weight", {cfg.n_embd}, ParamRole::norm, head);
  if (!cfg.tie_embeddings) add_param(inv, "lm_head.weight", {cfg.padded_vocab_size(), cfg.n_embd}, ParamRole::head, head);
}

ParamInventory llama_inventory(const LlamaConfig& cfg) {
  cfg.validate();
  const int64_t C = cfg.n_embd, I = cfg.intermediate_size;
  ParamInventory inv;
  append_llama_embedding(inv, cfg);
  for (int i = 0; i < cfg.n_layer; ++i) {
    append_llama_attention(inv, cfg, i);
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add_param(inv, p + "mlp.gate_proj.weight", {I, C}, ParamRole::matrix, 1 + i);
    add_param(inv, p + "mlp.up_proj.weight", {I, C}, ParamRole::matrix, 1 + i);
    add_param(inv, p + "mlp.down_proj.weight", {C, I}, ParamRole::matrix, 1 + i);
  }
  append_llama_head(inv, cfg);
  return inv;
}

int64_t LlamaConfig::num_params() const { return inventory_numel(llama_inventory(*this)); }

double LlamaConfig::flops_per_token(int context) const {
  int64_t n_matmul = 0;
  for (const auto& p : llama_inventory(*this).params) {
    // The embedding lookup is free; it multiplies only as the tied head.
    if (p.role == ParamRole::norm || (p.role == ParamRole::embedding && !tie_embeddings)) continue;
    n_matmul += p.numel();
  }
  return palm_flops_per_token(n_matmul, n_layer, n_embd, context);
}

}  // namespace mfsdp
