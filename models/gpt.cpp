#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "runtime/ops.h"

namespace mfsdp {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GPT::GPT(const GPTConfig& cfg) : cfg_(cfg), inv_(gpt_inventory(cfg)), params_(inv_, "GPT") {}

void GPT::bind(const std::string& name, const Tensor& t) { params_.bind(name, t); }

const Tensor& GPT::param(const std::string& name) const { return params_.get(name); }

void GPT::init_param(const GPTConfig& cfg, const ParamSpec& spec, uint64_t seed, float* out) {
  const int64_t n = spec.numel();
  if (spec.role == ParamRole::bias) {
    std::fill(out, out + n, 0.0f);
    return;
  }
  if (spec.role == ParamRole::norm) {
    std::fill(out, out + n, 1.0f);
    return;
  }
  double std = cfg.init_std;
  if (ends_with(spec.name, "attn.c_proj.weight") || ends_with(spec.name, "mlp.c_proj.weight"))
    std /= std::sqrt(2.0 * cfg.n_layer);
  normal_init(seed, spec.name, std, out, n);
  if (spec.role == ParamRole::embedding || spec.role == ParamRole::head) {
    if (spec.name == "wte.weight" || spec.name == "lm_head.weight") {  // padded vocabulary rows
      const int64_t C = spec.shape[1];
      std::fill(out + static_cast<int64_t>(cfg.vocab_size) * C, out + n, 0.0f);
    }
  }
}

void GPT::allocate_local(uint64_t seed, Device device) {
  params_.allocate_local(inv_, [&](const ParamSpec& p, float* out) { init_param(cfg_, p, seed, out); }, device);
}

Tensor GPT::embed(const Tensor& tokens) const {
  check_arg(tokens.dim() == 2 && tokens.size(1) <= cfg_.seq_len, "GPT::embed",
            "tokens must be [B, T<=" + std::to_string(cfg_.seq_len) + "], got " + tokens.describe());
  return embedding(param("wte.weight"), param("wpe.weight"), tokens);
}

Tensor GPT::block(int layer, const Tensor& x) const {
  const std::string p = "h." + std::to_string(layer) + ".";
  auto P = [&](const char* n) -> const Tensor& { return param(p + n); };
  Tensor h = layer_norm(x, P("ln_1.weight"), P("ln_1.bias"));
  Tensor qkv = linear(h, P("attn.c_attn.weight"), P("attn.c_attn.bias"));
  Tensor a = causal_self_attention(qkv, cfg_.n_head);
  Tensor x1 = add(x, linear(a, P("attn.c_proj.weight"), P("attn.c_proj.bias")));
  Tensor h2 = layer_norm(x1, P("ln_2.weight"), P("ln_2.bias"));
  Tensor m = gelu(linear(h2, P("mlp.c_fc.weight"), P("mlp.c_fc.bias")));
  return add(x1, linear(m, P("mlp.c_proj.weight"), P("mlp.c_proj.bias")));
}

Tensor GPT::logits(const Tensor& x) const {
  Tensor h = layer_norm(x, param("ln_f.weight"), param("ln_f.bias"));
  const Tensor& W = cfg_.tie_embeddings ? param("wte.weight") : param("lm_head.weight");
  const int64_t C = cfg_.n_embd;
  return linear(h.reshape({h.numel() / C, C}), W);
}

Tensor GPT::head_loss(const Tensor& x, const Tensor& targets, double divisor) const {
  return cross_entropy(logits(x), targets.reshape({targets.numel()}), cfg_.vocab_size, divisor);
}

std::vector<int> GPT::units_needed_by(int u) const {
  if (u == head_unit() && cfg_.tie_embeddings && u != 0) return {u, 0};
  return {u};
}

Tensor GPT::forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const {
  check_arg(u >= 0 && u <= head_unit(), "GPT::forward_unit", "unit " + std::to_string(u) + " of " +
                                                                 std::to_string(head_unit() + 1));
  if (u == 0) return embed(batch.tokens);
  if (u == head_unit()) return head_loss(x, batch.targets, loss_divisor);
  return block(u - 1, x);
}

Tensor GPT::forward_logits(const Tensor& tokens) const {
  Tensor x = embed(tokens);
  for (int l = 0; l < cfg_.n_layer; ++l) x = block(l, x);
  return logits(x);
}

Tensor GPT::forward_loss(const Tensor& tokens, const Tensor& targets) const {
  Tensor x = embed(tokens);
  for (int l = 0; l < cfg_.n_layer; ++l) x = block(l, x);
  return head_loss(x, targets);
}

std::vector<int32_t> sample_tokens(const GPT& model, std::vector<int32_t> prompt, int n, float temperature,
                                   int top_k, uint64_t seed) {
  return sample_from_logits([&](const Tensor& t) { return model.forward_logits(t); }, model.config().seq_len,
                            model.config().vocab_size, std::move(prompt), n, temperature, top_k, seed);
}

}  // namespace mfsdp
