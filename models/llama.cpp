#include "models/llama.h"

#include <algorithm>

#include "runtime/ops.h"

namespace mfsdp {

void Llama::init_param(const LlamaConfig& cfg, const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count,
                       float* out) {
  if (spec.role == ParamRole::norm) {
    std::fill(out, out + count, 1.0f);
    return;
  }
  normal_init(seed, spec.name, cfg.init_std, first, count, out);
  if (spec.role == ParamRole::embedding || spec.role == ParamRole::head)  // padded vocabulary rows
    zero_from(static_cast<int64_t>(cfg.vocab_size) * spec.shape[1], first, count, out);
}

Tensor llama_embed(const LlamaConfig& cfg, const ParamLookup& param, const Tensor& tokens, const Tensor& index) {
  check_arg(tokens.dim() == 2 && tokens.size(1) <= cfg.seq_len, "Llama::embed",
            "tokens must be [B, T<=" + std::to_string(cfg.seq_len) + "], got " + tokens.describe());
  return embedding(param("model.embed_tokens.weight"), Tensor(), tokens, index);
}

Tensor Llama::embed(const Tensor& tokens, const Tensor& index) const { return llama_embed(cfg_, lookup(), tokens, index); }

Tensor llama_attention_residual(const LlamaConfig& cfg, int layer, const ParamLookup& param, const Tensor& x) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  auto P = [&](const char* n) -> const Tensor& { return param(p + n); };
  const float eps = static_cast<float>(cfg.norm_eps), theta = static_cast<float>(cfg.rope_theta);
  // the norm's and attention's outputs only feed GEMMs: bf16 under bf16 matmuls (the residual
  // stream stays f32)
  Tensor h = rms_norm(x, P("input_layernorm.weight"), eps, matmul_dtype());
  Tensor q = rotary_embedding(linear(h, P("self_attn.q_proj.weight")), cfg.n_head, theta);
  Tensor k = rotary_embedding(linear(h, P("self_attn.k_proj.weight")), cfg.n_kv_head, theta);
  Tensor v = linear(h, P("self_attn.v_proj.weight"));
  Tensor a = causal_attention(q, k, v, cfg.n_head, cfg.n_kv_head, matmul_dtype());
  return add(x, linear(a, P("self_attn.o_proj.weight")));
}

Tensor Llama::block(int layer, const Tensor& x) const {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  auto P = [&](const char* n) -> const Tensor& { return param(p + n); };
  Tensor x1 = llama_attention_residual(cfg_, layer, lookup(), x);
  // SwiGLU's output only feeds the down projection: bf16 under bf16 matmuls
  Tensor h2 = rms_norm(x1, P("post_attention_layernorm.weight"), static_cast<float>(cfg_.norm_eps), matmul_dtype());
  Tensor m = swiglu(linear(h2, P("mlp.gate_proj.weight")), linear(h2, P("mlp.up_proj.weight")), matmul_dtype());
  return add(x1, linear(m, P("mlp.down_proj.weight")));
}

namespace {
// The head's input and weight: norm(x) as [B*T, C] and embed_tokens (tied) or lm_head [Vp, C].
Tensor head_hidden(const LlamaConfig& cfg, const ParamLookup& param, const Tensor& x) {
  Tensor h = rms_norm(x, param("model.norm.weight"), static_cast<float>(cfg.norm_eps), matmul_dtype());
  return h.reshape({h.numel() / cfg.n_embd, cfg.n_embd});
}
const Tensor& head_weight(const LlamaConfig& cfg, const ParamLookup& param) {
  return cfg.tie_embeddings ? param("model.embed_tokens.weight") : param("lm_head.weight");
}
}  // namespace

Tensor llama_logits(const LlamaConfig& cfg, const ParamLookup& param, const Tensor& x) {
  return linear(head_hidden(cfg, param, x), head_weight(cfg, param));
}

Tensor llama_head_loss(const LlamaConfig& cfg, const ParamLookup& param, const Tensor& x, const Tensor& targets,
                       double divisor) {
  return classifier_loss(head_hidden(cfg, param, x), head_weight(cfg, param), targets.reshape({targets.numel()}),
                         cfg.vocab_size, divisor);
}

Tensor Llama::logits(const Tensor& x) const { return llama_logits(cfg_, lookup(), x); }

Tensor Llama::head_loss(const Tensor& x, const Tensor& targets, double divisor) const {
  return llama_head_loss(cfg_, lookup(), x, targets, divisor);
}

}  // namespace mfsdp
