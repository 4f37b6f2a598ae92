#include "models/gpt_spec.h"

#include <stdexcept>

namespace mfsdp {

void validate_transformer_dims(int n_layer, int n_head, int n_embd, int seq_len, int vocab_size) {
  auto fail = [](const std::string& field, const std::string& why) {
    throw std::invalid_argument("model." + field + ": " + why);
  };
  if (n_layer < 1) fail("n_layer", "must be >= 1, got " + std::to_string(n_layer));
  if (n_head < 1) fail("n_head", "must be >= 1, got " + std::to_string(n_head));
  if (n_embd < 1) fail("n_embd", "must be >= 1, got " + std::to_string(n_embd));
  if (n_embd % n_head != 0)
    fail("n_embd", "must be divisible by n_head (" + std::to_string(n_embd) + " % " + std::to_string(n_head) + " != 0)");
  if (seq_len < 1) fail("seq_len", "must be >= 1, got " + std::to_string(seq_len));
  if (vocab_size < 2) fail("vocab_size", "must be >= 2, got " + std::to_string(vocab_size));
}

void GPTConfig::validate() const { validate_transformer_dims(n_layer, n_head, n_embd, seq_len, vocab_size); }

ParamInventory gpt_inventory(const GPTConfig& cfg) {
  cfg.validate();
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab_size(), T = cfg.seq_len;
  ParamInventory inv;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamRole role, int unit, int qkv = 1) {
    inv.params.push_back(ParamSpec{std::move(name), std::move(shape), role, unit, qkv});
  };
  inv.unit_names.push_back("embedding");
  add("wte.weight", {Vp, C}, ParamRole::embedding, 0);
  add("wpe.weight", {T, C}, ParamRole::embedding, 0);
  for (int i = 0; i < cfg.n_layer; ++i) {
    const int u = 1 + i;
    const std::string p = "h." + std::to_string(i) + ".";
    inv.unit_names.push_back("h." + std::to_string(i));
    add(p + "ln_1.weight", {C}, ParamRole::norm, u);
    add(p + "ln_1.bias", {C}, ParamRole::bias, u);
    add(p + "attn.c_attn.weight", {3 * C, C}, ParamRole::matrix, u, 3);
    add(p + "attn.c_attn.bias", {3 * C}, ParamRole::bias, u);
    add(p + "attn.c_proj.weight", {C, C}, ParamRole::matrix, u);
    add(p + "attn.c_proj.bias", {C}, ParamRole::bias, u);
    add(p + "ln_2.weight", {C}, ParamRole::norm, u);
    add(p + "ln_2.bias", {C}, ParamRole::bias, u);
    add(p + "mlp.c_fc.weight", {4 * C, C}, ParamRole::matrix, u);
    add(p + "mlp.c_fc.bias", {4 * C}, ParamRole::bias, u);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, ParamRole::matrix, u);
    add(p + "mlp.c_proj.bias", {C}, ParamRole::bias, u);
  }
  const int head = cfg.n_layer + 1;
  inv.unit_names.push_back("head");
  add("ln_f.weight", {C}, ParamRole::norm, head);
  add("ln_f.bias", {C}, ParamRole::bias, head);
  if (!cfg.tie_embeddings) add("lm_head.weight", {Vp, C}, ParamRole::head, head);
  return inv;
}

int64_t inventory_numel(const ParamInventory& inv) {
  int64_t n = 0;
  for (const auto& p : inv.params) n += p.numel();
  return n;
}

double palm_flops_per_token(int64_t n_matmul, int n_layer, int n_embd, int context) {
  return 6.0 * static_cast<double>(n_matmul) + 12.0 * n_layer * n_embd * static_cast<double>(context);
}

int64_t GPTConfig::num_params() const { return inventory_numel(gpt_inventory(*this)); }

double GPTConfig::flops_per_token(int context) const {
  int64_t n_matmul = 0;
  for (const auto& p : gpt_inventory(*this).params)
  {
    // Lookups are free: wpe never multiplies; wte multiplies only as the tied head.
    if (p.name == "wpe.weight" || (p.name == "wte.weight" && !tie_embeddings)) continue;
    if (p.role == ParamRole::norm || p.role == ParamRole::bias) continue;
    n_matmul += p.numel();
  }
  return palm_flops_per_token(n_matmul, n_layer, n_embd, context);
}

}  // namespace mfsdp
