#include "models/model_presets.h"

#include <stdexcept>

#include "models/gpt_spec.h"
#include "models/moe_spec.h"

namespace mfsdp {
namespace {

ParamInventory llama_inventory(const ModelShape& m) {
  if (m.n_layer < 1 || m.n_embd < 1 || m.n_head < 1 || m.n_embd % m.n_head || m.n_kv_head < 1 ||
      m.n_head % m.n_kv_head || m.intermediate < 1 || m.vocab < 1)
    throw std::invalid_argument("llama shape " + m.name + ": need n_head | n_embd, n_kv_head | n_head, sizes >= 1");
  const int64_t C = m.n_embd, I = m.intermediate, KV = static_cast<int64_t>(m.n_kv_head) * (C / m.n_head);
  ParamInventory inv;
  inv.unit_names.push_back("embedding");
  inv.params.push_back({"embed_tokens.weight", {m.vocab, C}, ParamRole::embedding, 0, 1});
  for (int l = 0; l < m.n_layer; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const int u = l + 1;
    inv.unit_names.push_back("layers." + std::to_string(l));
    inv.params.push_back({p + "input_layernorm.weight", {C}, ParamRole::norm, u, 1});
    inv.params.push_back({p + "self_attn.q_proj.weight", {C, C}, ParamRole::matrix, u, 1});
    inv.params.push_back({p + "self_attn.k_proj.weight", {KV, C}, ParamRole::matrix, u, 1});
    inv.params.push_back({p + "self_attn.v_proj.weight", {KV, C}, ParamRole::matrix, u, 1});
    inv.params.push_back({p + "self_attn.o_proj.weight", {C, C}, ParamRole::matrix, u, 1});
    inv.params.push_back({p + "post_attention_layernorm.weight", {C}, ParamRole::norm, u, 1});
    inv.params.push_back({p + "mlp.gate_proj.weight", {I, C}, ParamRole::matrix, u, 1});
    inv.params.push_back({p + "mlp.up_proj.weight", {I, C}, ParamRole::matrix, u, 1});
    inv.params.push_back({p + "mlp.down_proj.weight", {C, I}, ParamRole::matrix, u, 1});
  }
  const int head = m.n_layer + 1;
  inv.unit_names.push_back("head");
  inv.params.push_back({"norm.weight", {C}, ParamRole::norm, head, 1});
  inv.params.push_back({"lm_head.weight", {m.vocab, C}, ParamRole::head, head, 1});
  return inv;
}

ModelShape gpt2(const char* name, int L, int H, int C) {
  ModelShape m;
  m.name = name;
  m.n_layer = L;
  m.n_head = m.n_kv_head = H;
  m.n_embd = C;
  m.intermediate = 4 * static_cast<int64_t>(C);
  return m;
}

ModelShape llama(const char* name, int L, int C, int H, int KV, int64_t I, int64_t V, int T) {
  ModelShape m;
  m.name = name;
  m.family = "llama";
  m.n_layer = L;
  m.n_embd = C;
  m.n_head = H;
  m.n_kv_head = KV;
  m.intermediate = I;
  m.vocab = V;
  m.seq_len = T;
  m.tie_embeddings = false;
  return m;
}

// A Qwen2-MoE-shaped decoder (every layer sparse, untied head).
ModelShape qwen2_moe(const char* name, int L, int C, int H, int64_t I, int E, int k, int64_t shared, int64_t V, int T) {
  ModelShape m = llama(name, L, C, H, H, I, V, T);
  m.family = "qwen2_moe";
  m.num_experts = E;
  m.experts_per_tok = k;
  m.shared_intermediate = shared;
  return m;
}

// Published shapes: GPT-2 (Radford et al. 2019), Llama 1 (Touvron et al. 2023), Llama 3 (Meta 2024);
// qwen2-moe-100m is ours (98M parameters, 54M active), for benchmarks and plans of small MoEs;
// qwen2-moe-a2.7b is Qwen1.5-MoE-A2.7B's shape (Qwen team 2024: 60 experts of 1408, top 4, shared
// expert 5632) without its q/k/v biases.
const std::vector<ModelShape>& presets() {
  static const std::vector<ModelShape> p{
      gpt2("gpt2-124m", 12, 12, 768),
      gpt2("gpt2-350m", 24, 16, 1024),
      gpt2("gpt2-774m", 36, 20, 1280),
      gpt2("gpt2-1.5b", 48, 25, 1600),
      llama("llama-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
      llama("llama-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
      llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
      llama("llama-30b", 60, 6656, 52, 52, 17920, 32000, 2048),
      llama("llama-65b", 80, 8192, 64, 64, 22016, 32000, 2048),
      llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
      qwen2_moe("qwen2-moe-100m", 8, 512, 8, 256, 16, 2, 512, 32000, 1024),
      qwen2_moe("qwen2-moe-a2.7b", 24, 2048, 16, 1408, 60, 4, 5632, 151936, 8192),
  };
  return p;
}

}  // namespace

GPTConfig ModelShape::gpt_config() const {
  if (family != "gpt2") throw std::invalid_argument("model shape " + name + " is a " + family + " shape, not gpt2");
  GPTConfig c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.seq_len = seq_len;
  c.vocab_size = static_cast<int>(vocab);
  c.tie_embeddings = tie_embeddings;
  c.validate();
  return c;
}

LlamaConfig ModelShape::llama_config() const {
  if (family != "llama") throw std::invalid_argument("model shape " + name + " is a " + family + " shape, not llama");
  LlamaConfig c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.n_embd = n_embd;
  c.intermediate_size = static_cast<int>(intermediate);
  c.seq_len = seq_len;
  c.vocab_size = static_cast<int>(vocab);
  c.tie_embeddings = false;
  c.validate();
  return c;
}

MoeConfig ModelShape::moe_config() const {
  if (family != "qwen2_moe") throw std::invalid_argument("model shape " + name + " is a " + family + " shape, not qwen2_moe");
  MoeConfig c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.n_embd = n_embd;
  c.seq_len = seq_len;
  c.vocab_size = static_cast<int>(vocab);
  c.tie_embeddings = false;
  c.num_experts = num_experts;
  c.num_experts_per_tok = experts_per_tok;
  c.moe_intermediate_size = static_cast<int>(intermediate);
  c.shared_expert_intermediate_size = static_cast<int>(shared_intermediate);
  c.validate();
  return c;
}

ParamInventory ModelShape::inventory() const {
  if (family == "qwen2_moe") return moe_inventory(moe_config());
  return family == "llama" ? llama_inventory(*this) : gpt_inventory(gpt_config());
}

int64_t ModelShape::num_params() const {
  int64_t n = 0;
  for (const auto& p : inventory().params) n += p.numel();
  return n;
}

double ModelShape::flops_per_token(int context) const {
  if (family == "qwen2_moe") return moe_config().flops_per_token(context);
  if (family != "llama") return gpt_config().flops_per_token(context);
  int64_t n_matmul = 0;
  for (const auto& p : inventory().params)
    if (p.role == ParamRole::matrix || p.role == ParamRole::head) n_matmul += p.numel();
  return 6.0 * static_cast<double>(n_matmul) + 12.0 * n_layer * n_embd * static_cast<double>(context);
}

ModelProfile ModelShape::profile() const {
  ModelProfile p;
  p.name = name;
  p.family = family;
  p.inventory = inventory();
  p.n_layer = n_layer;
  p.n_embd = n_embd;
  p.n_head = n_head;
  p.vocab = vocab;
  p.matmul_flops_per_token = flops_per_token(0);
  return p;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const auto& m : presets()) out.push_back(m.name);
  return out;
}

ModelShape model_preset(const std::string& name, int layers) {
  for (ModelShape m : presets())
    if (m.name == name) {
      if (layers > 0) m.n_layer = layers;
      return m;
    }
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown model preset '" + name + "' (known: " + known + ")");
}

ModelShape model_shape_from_json(const nlohmann::json& j) {
  ModelShape m;
  m.name = j.value("name", std::string("custom"));
  m.family = j.value("family", m.family);
  m.n_layer = j.value("n_layer", m.n_layer);
  m.n_embd = j.value("n_embd", m.n_embd);
  m.n_head = j.value("n_head", m.n_head);
  m.n_kv_head = j.value("n_kv_head", m.n_head);
  m.intermediate = j.value("intermediate", m.family == "gpt2" ? 4 * static_cast<int64_t>(m.n_embd) : m.intermediate);
  m.vocab = j.value("vocab", m.vocab);
  m.seq_len = j.value("seq_len", m.seq_len);
  m.tie_embeddings = j.value("tie_embeddings", m.family == "gpt2");
  m.num_experts = j.value("num_experts", m.num_experts);
  m.experts_per_tok = j.value("experts_per_tok", m.experts_per_tok);
  m.shared_intermediate = j.value("shared_intermediate", m.shared_intermediate);
  return m;
}

nlohmann::json to_json(const ModelShape& m) {
  return {{"name", m.name},         {"family", m.family},     {"n_layer", m.n_layer},
          {"n_embd", m.n_embd},     {"n_head", m.n_head},     {"n_kv_head", m.n_kv_head},
          {"intermediate", m.intermediate}, {"vocab", m.vocab}, {"seq_len", m.seq_len},
          {"tie_embeddings", m.tie_embeddings}, {"num_experts", m.num_experts},
          {"experts_per_tok", m.experts_per_tok}, {"shared_intermediate", m.shared_intermediate},
          {"params", m.num_params()}};
}

}  // namespace mfsdp
