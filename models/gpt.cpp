#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "runtime/autograd.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

constexpr float kLnEps = static_cast<float>(kGptLayerNormEps);

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void GPT::init_param(const GPTConfig& cfg, const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count,
                     float* out) {
  if (spec.role == ParamRole::bias || spec.role == ParamRole::norm) {
    std::fill(out, out + count, spec.role == ParamRole::norm ? 1.0f : 0.0f);
    return;
  }
  double std = cfg.init_std;
  if (ends_with(spec.name, "attn.c_proj.weight") || ends_with(spec.name, "mlp.c_proj.weight"))
    std /= std::sqrt(2.0 * cfg.n_layer);
  normal_init(seed, spec.name, std, first, count, out);
  if (spec.name == "wte.weight" || spec.name == "lm_head.weight")  // padded vocabulary rows
    zero_from(static_cast<int64_t>(cfg.vocab_size) * spec.shape[1], first, count, out);
}

Tensor GPT::embed(const Tensor& tokens, const Tensor& index) const {
  check_arg(tokens.dim() == 2 && tokens.size(1) <= cfg_.seq_len, "GPT::embed",
            "tokens must be [B, T<=" + std::to_string(cfg_.seq_len) + "], got " + tokens.describe());
  return embedding(param("wte.weight"), param("wpe.weight"), tokens, index);
}

Tensor GPT::block(int layer, const Tensor& x) const {
  const std::string p = "h." + std::to_string(layer) + ".";
  auto P = [&](const char* n) -> const Tensor& { return param(p + n); };
  // the norms' and attention's outputs only feed GEMMs: bf16 under bf16 matmuls (the residual stream
  // stays f32)
  Tensor h = layer_norm(x, P("ln_1.weight"), P("ln_1.bias"), kLnEps, matmul_dtype());
  Tensor qkv = linear(h, P("attn.c_attn.weight"), P("attn.c_attn.bias"));
  if (record_logits_ && grad_mode_enabled()) {  // QK-Clip's statistic of training forwards
    const std::vector<float> mx = attention_max_logits(qkv, cfg_.n_head);
    for (int h = 0; h < cfg_.n_head; ++h) {
      float& slot = logit_max_[static_cast<size_t>(layer) * cfg_.n_head + h];
      slot = std::max(slot, mx[h]);
    }
  }
  Tensor a = causal_self_attention(qkv, cfg_.n_head, matmul_dtype());
  Tensor x1 = add(x, linear(a, P("attn.c_proj.weight"), P("attn.c_proj.bias")));
  Tensor h2 = layer_norm(x1, P("ln_2.weight"), P("ln_2.bias"), kLnEps, matmul_dtype());
  return add(x1, gelu_mlp(h2, P("mlp.c_fc.weight"), P("mlp.c_fc.bias"), P("mlp.c_proj.weight"),
                          P("mlp.c_proj.bias")));
}

Tensor GPT::head_hidden(const Tensor& x) const {
  Tensor h = layer_norm(x, param("ln_f.weight"), param("ln_f.bias"), kLnEps, matmul_dtype());
  return h.reshape({h.numel() / cfg_.n_embd, cfg_.n_embd});
}

const Tensor& GPT::head_weight() const {
  return cfg_.tie_embeddings ? param("wte.weight") : param("lm_head.weight");
}

Tensor GPT::logits(const Tensor& x) const { return linear(head_hidden(x), head_weight()); }

Tensor GPT::head_loss(const Tensor& x, const Tensor& targets, double divisor) const {
  return classifier_loss(head_hidden(x), head_weight(), targets.reshape({targets.numel()}), cfg_.vocab_size, divisor);
}

std::vector<AttentionHead> GPT::attention_heads() const {
  const int64_t C = cfg_.n_embd, d = attention_head_dim();
  std::vector<AttentionHead> heads;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "h." + std::to_string(l) + ".attn.c_attn.";
    for (int h = 0; h < cfg_.n_head; ++h) {
      AttentionHead head;
      for (const char* t : {"weight", "bias"})
        for (int64_t block : {int64_t{0}, C})  // the query rows, then the key rows
          head.qk_rows.push_back({p + t, block + h * d, d});
      heads.push_back(std::move(head));
    }
  }
  return heads;
}

void GPT::record_attention_logits(bool on) {
  record_logits_ = on;
  logit_max_.assign(static_cast<size_t>(cfg_.n_layer) * cfg_.n_head, -INFINITY);
}

std::vector<float> GPT::take_attention_logit_maxima() {
  std::vector<float> out = logit_max_;
  std::fill(logit_max_.begin(), logit_max_.end(), -INFINITY);
  return out;
}

}  // namespace mfsdp
