// A test-only UnitModel that forwards every call to another one: the base of the fault-injecting
// wrappers (tests/nan_grad_model.h, tests/train/train_with_faults.cpp), which override only what
// they change. Product code never builds one.
#pragma once
#include <string>
#include <vector>

#include "runtime/engine/unit_model.h"

namespace mfsdp::testing {

/// Forwards every UnitModel call to `inner` (not owned; must outlive this object).
class ForwardingUnitModel : public UnitModel {
 public:
  explicit ForwardingUnitModel(UnitModel& inner) : inner_(inner) {}

  const ParamInventory& inventory() const override { return inner_.inventory(); }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  void bind(const std::string& name, const Tensor& t) override { inner_.bind(name, t); }
  std::vector<int> units_needed_by(int u) const override { return inner_.units_needed_by(u); }
  void init_param(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count, float* out) const override {
    inner_.init_param(spec, seed, first, count, out);
  }
  Tensor head_logits(const Tensor& x) const override { return inner_.head_logits(x); }
  int64_t attention_head_dim() const override { return inner_.attention_head_dim(); }
  std::vector<AttentionHead> attention_heads() const override { return inner_.attention_heads(); }
  void record_attention_logits(bool on) override { inner_.record_attention_logits(on); }
  std::vector<float> take_attention_logit_maxima() override { return inner_.take_attention_logit_maxima(); }
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override {
    return inner_.forward_unit(u, x, batch, loss_divisor);
  }

 protected:
  UnitModel& inner_;
};

}  // namespace mfsdp::testing
