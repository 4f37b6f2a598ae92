// A test-only UnitModel that trains another one unchanged, except that one parameter's gradient
// gets a NaN: the fault behind the NaN-gradient tests (tests/engine/test_engine_faults.cpp, and
// the end-to-end run of tests/train/train_with_faults.cpp). Product code never builds one.
#pragma once
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/autograd.h"
#include "tests/forwarding_unit_model.h"

namespace mfsdp::testing {

/// Runs `inner` unchanged, except that the gradient of parameter `target` gets a NaN in its first
/// element at every backward. The forward values (and so the loss) are exactly the inner model's:
/// the unit that holds `target` reads a copy of it whose backward passes the incoming gradient
/// on with that one element poisoned.
class NanGradModel : public ForwardingUnitModel {
 public:
  NanGradModel(UnitModel& inner, std::string target) : ForwardingUnitModel(inner), target_(std::move(target)) {
    for (const ParamSpec& p : inner.inventory().params)
      if (p.name == target_) unit_ = p.unit;
    if (unit_ < 0) throw std::invalid_argument("NanGradModel: no parameter named " + target_);
  }

  void bind(const std::string& name, const Tensor& t) override {
    if (name == target_) bound_ = t;
    inner_.bind(name, t);
  }

  /// The inner unit forward; the unit of `target` reads the poisoning copy while grad mode is on.
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override {
    if (u != unit_ || !grad_mode_enabled() || !bound_.requires_grad())
      return inner_.forward_unit(u, x, batch, loss_divisor);
    const Tensor param = bound_;
    Tensor copy = param.clone();
    record(copy, "nan_grad", {param}, [param](const Tensor& g) {
      Tensor bad = g.clone();
      bad.view(0, {1}).fill(std::numeric_limits<float>::quiet_NaN());
      accumulate_grad(param, bad);
    });
    inner_.bind(target_, copy);
    Tensor out = inner_.forward_unit(u, x, batch, loss_divisor);
    inner_.bind(target_, param);
    return out;
  }

 private:
  std::string target_;
  int unit_ = -1;
  Tensor bound_;
};

}  // namespace mfsdp::testing
