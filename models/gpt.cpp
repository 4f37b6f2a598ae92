#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "runtime/autograd.h"
#include "runtime/core/rng.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GPT::GPT(const GPTConfig& cfg) : cfg_(cfg), inv_(gpt_inventory(cfg)) {
  for (const auto& p : inv_.params) shapes_[p.name] = p.shape;
}

void GPT::bind(const std::string& name, const Tensor& t) {
  auto it = shapes_.find(name);
  check_arg(it != shapes_.end(), "GPT::bind", "unknown parameter '" + name + "'");
  check_arg(t.shape() == it->second, "GPT::bind",
            name + ": expected shape " + shape_str(it->second) + ", got " + t.describe());
  params_[name] = t;
}

const Tensor& GPT::param(const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) {
    check_arg(shapes_.count(name) > 0, "GPT::param", "unknown parameter '" + name + "'");
    throw std::logic_error("[GPT::param] parameter '" + name + "' is not bound");
  }
  return it->second;
}

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
  uint64_t state = seed * 0x2545F4914F6CDD1DULL ^ hash_name(spec.name);
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller, two normals per draw
    const double u1 = uniform01(state), u2 = uniform01(state);
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(std * r * std::sin(2.0 * M_PI * u2));
  }
  if (spec.role == ParamRole::embedding || spec.role == ParamRole::head) {
    if (spec.name == "wte.weight" || spec.name == "lm_head.weight") {  // padded vocabulary rows
      const int64_t C = spec.shape[1];
      std::fill(out + static_cast<int64_t>(cfg.vocab_size) * C, out + n, 0.0f);
    }
  }
}

void GPT::allocate_local(uint64_t seed, Device device) {
  int64_t total = 0;
  for (const auto& p : inv_.params) total += p.numel();
  {
    MemCategoryScope s(MemCategory::parameters);
    local_params_ = Tensor::empty({total}, DType::f32, Device::CPU);
  }
  {
    MemCategoryScope s(MemCategory::gradients);
    local_grads_ = Tensor::zeros({total}, DType::f32, device);
  }
  int64_t off = 0;
  for (const auto& p : inv_.params) {
    init_param(cfg_, p, seed, local_params_.data_f32() + off);
    off += p.numel();
  }
  if (device != Device::CPU) {
    MemCategoryScope s(MemCategory::parameters);
    local_params_ = local_params_.to(device);
  }
  off = 0;
  for (const auto& p : inv_.params) {
    Tensor t = local_params_.view(off, p.shape);
    t.set_requires_grad(true);
    t.set_grad(local_grads_.view(off, p.shape));
    bind(p.name, t);
    off += p.numel();
  }
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
  if (record_logits_ && grad_mode_enabled()) {  // QK-Clip's statistic of training forwards
    const std::vector<float> mx = attention_max_logits(qkv, cfg_.n_head);
    for (int h = 0; h < cfg_.n_head; ++h) {
      float& slot = logit_max_[static_cast<size_t>(layer) * cfg_.n_head + h];
      slot = std::max(slot, mx[h]);
    }
  }
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
  NoGradGuard no_grad;
  const GPTConfig& cfg = model.config();
  if (prompt.empty()) prompt.push_back(0);
  uint64_t state = seed;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(prompt.size()), cfg.seq_len);
    std::vector<int32_t> ctx(prompt.end() - T, prompt.end());
    Tensor logits = model.forward_logits(tokens_tensor(ctx, {1, T})).to(Device::CPU);
    const float* last = logits.data_f32() + (T - 1) * logits.size(1);
    std::vector<double> p(cfg.vocab_size);
    double mx = -INFINITY;
    for (int v = 0; v < cfg.vocab_size; ++v) mx = std::max(mx, static_cast<double>(last[v]));
    const double temp = std::max(1e-4f, temperature);
    if (top_k > 0 && top_k < cfg.vocab_size) {
      std::vector<float> sorted(last, last + cfg.vocab_size);
      std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
      const float kth = sorted[top_k - 1];
      for (int v = 0; v < cfg.vocab_size; ++v) p[v] = last[v] >= kth ? std::exp((last[v] - mx) / temp) : 0.0;
    } else {
      for (int v = 0; v < cfg.vocab_size; ++v) p[v] = std::exp((last[v] - mx) / temp);
    }
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    double r = uniform01(state) * total;
    int32_t next = cfg.vocab_size - 1;
    for (int v = 0; v < cfg.vocab_size; ++v) {
      r -= p[v];
      if (r <= 0) {
        next = v;
        break;
      }
    }
    prompt.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace mfsdp
