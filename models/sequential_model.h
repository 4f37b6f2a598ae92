// The part of a model family that only depends on its unit layout: unit 0 embeds the tokens, unit
// 1+l runs block l, unit n_layer+1 is the head that returns the loss. GPT (gpt.h) and Llama
// (llama.h) derive from it and supply the maths.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/model_common.h"
#include "runtime/engine/unit_model.h"

namespace mfsdp {

/// CRTP base of a model family. Derived provides
///   Tensor embed(const Tensor& tokens, const Tensor& index) const;  // unit 0: tokens i32 [B, T] -> x [B, T, C]
///   Tensor block(int layer, const Tensor& x) const;      // unit 1+layer: x -> x
///   Tensor logits(const Tensor& x) const;                // head: x [B, T, C] -> logits [B*T, Vp]
///   Tensor head_loss(const Tensor& x, const Tensor& targets, double divisor) const;
///   static void init_param(const Config&, const ParamSpec&, uint64_t seed, int64_t first, int64_t count, float* out);
/// and Config has n_layer, vocab_size and tie_embeddings (a tied head also reads unit 0).
///
/// Parameters are not owned by the model: each name is bound to a tensor (a view into an FSDP
/// unit's gathered buffer, or into one local buffer via allocate_local()); the unit forwards read
/// whatever is bound, so the engine decides what is resident.
template <class Derived, class Config>
class SequentialModel : public UnitModel {
 public:
  /// `name` prefixes error messages ("GPT::bind: ...").
  SequentialModel(const Config& cfg, ParamInventory inv, const std::string& name)
      : cfg_(cfg), inv_(std::move(inv)), params_(inv_, name), name_(name) {}

  const Config& config() const { return cfg_; }
  const ParamInventory& inventory() const override { return inv_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int head_unit() const { return cfg_.n_layer + 1; }

  /// Binds parameter `name` to `t` (shape must match the inventory). Throws std::invalid_argument
  /// for unknown names or other shapes.
  void bind(const std::string& name, const Tensor& t) override { params_.bind(name, t); }
  /// The tensor bound to `name`; throws when unbound or unknown.
  const Tensor& param(const std::string& name) const { return params_.get(name); }

  /// {u}, plus the embedding unit 0 for the head unit when the head is tied to the embedding.
  std::vector<int> units_needed_by(int u) const override {
    if (u == head_unit() && cfg_.tie_embeddings && u != 0) return {u, 0};
    return {u};
  }
  /// Unit 0 = embed(batch.tokens, batch.embedding_index), 1..n_layer = block(u-1, x), n_layer+1 = head_loss. Throws
  /// std::invalid_argument for a unit outside [0, head_unit()].
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override {
    check_arg(u >= 0 && u <= head_unit(), (name_ + "::forward_unit").c_str(),
              "unit " + std::to_string(u) + " of " + std::to_string(head_unit() + 1));
    if (u == 0) return self().embed(batch.tokens, batch.embedding_index);
    if (u == head_unit()) return self().head_loss(x, batch.targets, loss_divisor);
    return self().block(u - 1, x);
  }
  /// Derived::logits(x): the head's logits of the last block's output.
  Tensor head_logits(const Tensor& x) const override { return self().logits(x); }
  /// Derived::init_param(config(), spec, seed, first, count, out).
  void init_param(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count, float* out) const override {
    Derived::init_param(cfg_, spec, seed, first, count, out);
  }

  /// Allocates one flat parameter buffer and one flat gradient buffer on `device`, binds views of
  /// them (parameters require grad; gradients are preallocated views) and initializes from `seed`.
  void allocate_local(uint64_t seed, Device device = Device::CPU) {
    params_.allocate_local(inv_, [&](const ParamSpec& p, float* out) { Derived::init_param(cfg_, p, seed, 0, p.numel(), out); },
                           device);
  }
  /// The flat buffers of allocate_local() (undefined otherwise).
  const Tensor& local_params() const { return params_.local_params(); }
  const Tensor& local_grads() const { return params_.local_grads(); }

  /// Whole model (every parameter bound): tokens i32 [B, T] -> logits [B*T, Vp].
  Tensor forward_logits(const Tensor& tokens) const { return self().logits(body(tokens)); }
  /// Whole model (every parameter bound): mean cross-entropy.
  Tensor forward_loss(const Tensor& tokens, const Tensor& targets) const {
    return self().head_loss(body(tokens), targets, 0);
  }

 protected:
  Config cfg_;
  ParamInventory inv_;
  BoundParams params_;

 private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
  Tensor body(const Tensor& tokens) const {
    Tensor x = self().embed(tokens, Tensor());
    for (int l = 0; l < cfg_.n_layer; ++l) x = self().block(l, x);
    return x;
  }
  std::string name_;
};

/// Samples `n` tokens after `prompt` with temperature and top-k (0 = all) from the whole model
/// (every parameter bound) on the host; deterministic for a seed. Context is cut to seq_len.
template <class Derived, class Config>
std::vector<int32_t> sample_tokens(const SequentialModel<Derived, Config>& model, std::vector<int32_t> prompt, int n,
                                   float temperature, int top_k, uint64_t seed) {
  return sample_from_logits([&](const Tensor& t) { return model.forward_logits(t); }, model.config().seq_len,
                            model.config().vocab_size, std::move(prompt), n, temperature, top_k, seed);
}

}  // namespace mfsdp
