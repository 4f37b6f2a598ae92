// Shared helpers of the engine tests: a tiny GPT, deterministic batches, and the world-1
// unsharded reference trainer (plain Muon + AdamW on full tensors, no communicator).
#pragma once
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "optim/optim.h"
#include "runtime/autograd.h"
#include "runtime/engine/sharded_engine.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"

namespace mfsdp::testing {

inline GPTConfig tiny_config(int n_layer = 2, int n_embd = 32, bool tied = true) {
  GPTConfig c;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = n_embd;
  c.seq_len = 16;
  c.vocab_size = 65;
  c.tie_embeddings = tied;
  return c;
}

inline EngineOptions test_options(bool split_qkv = false) {
  EngineOptions o;
  o.muon.split_qkv = split_qkv;
  o.muon.lr = 0.02;
  o.adamw.lr = 3e-3;
  o.muon.weight_decay = 0.01;
  o.adamw.weight_decay = 0.1;
  o.schedule.warmup_steps = 2;
  o.schedule.total_steps = 10;
  o.schedule.kind = DecayKind::cosine;
  o.grad_clip = 1.0;
  return o;
}

/// Bitwise equality (memcmp) of two f32 vectors / two doubles.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
inline bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

/// Global batch of `n` sequences for `step`: tokens[i] and targets (tokens shifted), deterministic.
inline std::vector<int32_t> global_tokens(int64_t step, int64_t n, int64_t T, int vocab) {
  std::vector<int32_t> v(n * (T + 1));
  uint64_t s = 0x1234 + static_cast<uint64_t>(step) * 7919;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<int32_t>((s >> 33) % vocab);
  }
  return v;
}

/// Sequences [first, first+count) of the global batch as a MicroBatch.
inline MicroBatch slice_batch(const std::vector<int32_t>& g, int64_t first, int64_t count, int64_t T) {
  std::vector<int32_t> tok, tgt;
  for (int64_t i = first; i < first + count; ++i) {
    tok.insert(tok.end(), g.begin() + i * (T + 1), g.begin() + i * (T + 1) + T);
    tgt.insert(tgt.end(), g.begin() + i * (T + 1) + 1, g.begin() + (i + 1) * (T + 1));
  }
  return {tokens_tensor(tok, {count, T}), tokens_tensor(tgt, {count, T})};
}

/// World-1 unsharded training: the definition the sharded engine must reproduce.
struct ReferenceTrainer {
  GPT model;
  EngineOptions opts;
  std::map<std::string, Tensor> m, v;
  int64_t steps = 0;
  std::vector<double> grad_norms;

  ReferenceTrainer(const GPTConfig& cfg, const EngineOptions& o, uint64_t seed) : model(cfg), opts(o) {
    model.allocate_local(seed);
    for (const auto& p : model.inventory().params) {
      m[p.name] = Tensor::zeros(p.shape);
      v[p.name] = Tensor::zeros(p.shape);
    }
  }

  double step(const std::vector<MicroBatch>& micro, int64_t step_index) {
    model.local_grads().zero();
    double loss = 0;
    for (const auto& mb : micro) {
      Tensor l = model.forward_loss(mb.tokens, mb.targets);
      loss += l.item();
      backward(l);
    }
    Kernels& k = kernels(Device::CPU);
    const Tensor& g = model.local_grads();
    k.scale(g.data_f32(), static_cast<float>(1.0 / micro.size()), g.numel());
    const double norm = std::sqrt(sum_of_squares_cpu(g.data_f32(), g.numel()));  // exact, as the engine's
    grad_norms.push_back(norm);
    const double coef = clip_coefficient(norm, opts.grad_clip);
    if (coef < 1) k.scale(g.data_f32(), static_cast<float>(coef), g.numel());
    const double mult = opts.schedule.multiplier(step_index);
    ++steps;
    for (const auto& p : model.inventory().params) {
      const Tensor& w = model.param(p.name);
      if (p.role == ParamRole::matrix) {
        muon_step_cpu(w.data_f32(), w.grad().data_f32(), m[p.name].data_f32(), p.shape[0], p.shape[1],
                      opts.muon.lr * mult, opts.muon, p.qkv_blocks);
      } else {
        AdamWOptions a = opts.adamw;
        if (p.shape.size() < 2) a.weight_decay = 0;
        adamw_step_cpu(w.data_f32(), w.grad().data_f32(), m[p.name].data_f32(), v[p.name].data_f32(), p.numel(),
                       opts.adamw.lr * mult, steps, a);
      }
    }
    return loss / micro.size();
  }

  std::map<std::string, std::vector<float>> parameters() const {
    std::map<std::string, std::vector<float>> out;
    for (const auto& p : model.inventory().params) out[p.name] = model.param(p.name).to_vector();
    return out;
  }
};

/// ||a - b|| / ||b|| (0 when both are 0).
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

/// rel_diff for a named GPT parameter. The key slice [C, 2C) of attn.c_attn.bias has an
/// analytically zero gradient (softmax is shift invariant), so its "gradient" is round-off whose
/// sign AdamW amplifies into order-dependent updates; it is compared absolutely (<= 1e-4) instead.
inline double param_rel_diff(const std::string& name, std::vector<float> a, std::vector<float> b) {
  const std::string suffix = "attn.c_attn.bias";
  if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const size_t C = a.size() / 3;
    for (size_t i = C; i < 2 * C; ++i) {
      if (std::fabs(a[i] - b[i]) > 1e-4) return 1.0;
      a[i] = b[i] = 0.0f;
    }
  }
  return rel_diff(a, b);
}

}  // namespace mfsdp::testing
