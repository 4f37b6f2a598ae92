#include "models/llama.h"

#include <algorithm>

#include "runtime/ops.h"

namespace mfsdp {

Llama::Llama(const LlamaConfig& cfg) : cfg_(cfg), inv_(llama_inventory(cfg)), params_(inv_, "Llama") {}

void Llama::init_param(const LlamaConfig& cfg, const ParamSpec& spec, uint64_t seed, float* out) {
  const int64_t n = spec.numel();
  if (spec.role == ParamRole::norm) {
    std::fill(out, out + n, 1.0f);
    return;
  }
  normal_init(seed, spec.name, cfg.init_std, out, n);
  if (spec.role == ParamRole::embedding || spec.role == ParamRole::head)  // padded vocabulary rows
    std::fill(out + static_cast<int64_t>(cfg.vocab_size) * spec.shape[1], out + n, 0.0f);
}

void Llama::allocate_local(uint64_t seed, Device device) {
  params_.allocate_local(inv_, [&](const ParamSpec& p, float* out) { init_param(cfg_, p, seed, out); }, device);
}

Tensor Llama::embed(const Tensor& tokens) const {
  check_arg(tokens.dim() == 2 && tokens.size(1) <= cfg_.seq_len, "Llama::embed",
            "tokens must be [B, T<=" + std::to_string(cfg_.seq_len) + "], got " + tokens.describe());
  return embedding(param("model.embed_tokens.weight"), Tensor(), tokens);
}

Tensor Llama::block(int layer, const Tensor& x) const {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  auto P = [&](const char* n) -> const Tensor& { return param(p + n); };
  const float eps = static_cast<float>(cfg_.norm_eps), theta = static_cast<float>(cfg_.rope_theta);
  Tensor h = rms_norm(x, P("input_layernorm.weight"), eps);
  Tensor q = rotary_embedding(linear(h, P("self_attn.q_proj.weight")), cfg_.n_head, theta);
  Tensor k = rotary_embedding(linear(h, P("self_attn.k_proj.weight")), cfg_.n_kv_head, theta);
  Tensor v = linear(h, P("self_attn.v_proj.weight"));
  Tensor a = causal_attention(q, k, v, cfg_.n_head, cfg_.n_kv_head);
  Tensor x1 = add(x, linear(a, P("self_attn.o_proj.weight")));
  Tensor h2 = rms_norm(x1, P("post_attention_layernorm.weight"), eps);
  Tensor m = swiglu(linear(h2, P("mlp.gate_proj.weight")), linear(h2, P("mlp.up_proj.weight")));
  return add(x1, linear(m, P("mlp.down_proj.weight")));
}

Tensor Llama::logits(const Tensor& x) const {
  Tensor h = rms_norm(x, param("model.norm.weight"), static_cast<float>(cfg_.norm_eps));
  const Tensor& W = cfg_.tie_embeddings ? param("model.embed_tokens.weight") : param("lm_head.weight");
  const int64_t C = cfg_.n_embd;
  return linear(h.reshape({h.numel() / C, C}), W);
}

Tensor Llama::head_loss(const Tensor& x, const Tensor& targets, double divisor) const {
  return cross_entropy(logits(x), targets.reshape({targets.numel()}), cfg_.vocab_size, divisor);
}

std::vector<int> Llama::units_needed_by(int u) const {
  if (u == head_unit() && cfg_.tie_embeddings) return {u, 0};
  return {u};
}

Tensor Llama::forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const {
  check_arg(u >= 0 && u <= head_unit(), "Llama::forward_unit",
            "unit " + std::to_string(u) + " of " + std::to_string(head_unit() + 1));
  if (u == 0) return embed(batch.tokens);
  if (u == head_unit()) return head_loss(x, batch.targets, loss_divisor);
  return block(u - 1, x);
}

Tensor Llama::forward_logits(const Tensor& tokens) const {
  Tensor x = embed(tokens);
  for (int l = 0; l < cfg_.n_layer; ++l) x = block(l, x);
  return logits(x);
}

Tensor Llama::forward_loss(const Tensor& tokens, const Tensor& targets) const {
  Tensor x = embed(tokens);
  for (int l = 0; l < cfg_.n_layer; ++l) x = block(l, x);
  return head_loss(x, targets);
}

std::vector<int32_t> sample_tokens(const Llama& model, std::vector<int32_t> prompt, int n, float temperature,
                                   int top_k, uint64_t seed) {
  return sample_from_logits([&](const Tensor& t) { return model.forward_logits(t); }, model.config().seq_len,
                            model.config().vocab_size, std::move(prompt), n, temperature, top_k, seed);
}

}  // namespace mfsdp
