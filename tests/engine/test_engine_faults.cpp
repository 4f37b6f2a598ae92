// A NaN gradient under a finite loss stops the step before the optimizer runs. The fault comes
// from a test-only UnitModel (tests/nan_grad_model.h) that trains the real GPT unchanged except that one
// parameter's gradient gets a NaN in its first element at every backward: the engine's own
// gradient-norm path (exact sum of squares, clipping on or off) must see it, name the tensor on
// every rank and leave the parameters and optimizer state untouched. Runs on the test backend's
// device (MFSDP_TEST_BACKEND, engine_test_comm.h) at any world size, under matrixfsdp and fsdp2.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "engine_test_comm.h"
#include "engine_test_util.h"
#include "tests/nan_grad_model.h"
#include "planner/planner.h"

using namespace mfsdp;
using namespace mfsdp::testing;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kT = 16, kB = 2;

/// This rank's kB sequences of step 0 (rank r takes global sequences [r * kB, (r + 1) * kB)).
std::vector<MicroBatch> rank_batches(int vocab) {
  const int W = world().world_size(), r = world().rank();
  const std::vector<int32_t> g = global_tokens(0, kB * W, kT, vocab);
  return {slice_batch(g, r * kB, kB, kT)};
}

}  // namespace

TEST_CASE("a NaN gradient under a finite loss stops before the optimizer step, clipping on or off",
          "[engine][faults]") {
  const std::string target = "h.1.mlp.c_fc.weight";
  const GPTConfig cfg = tiny_config();
  for (const Placement placement : {Placement::matrixfsdp, Placement::fsdp2})
    for (const double clip : {0.0, 1.0}) {
      INFO("placement " << placement_name(placement) << ", grad_clip " << clip);
      GPT gpt(cfg);
      NanGradModel model(gpt, target);
      const ShardPlan plan = make_plan(model.inventory(), world().world_size(), placement);
      EngineOptions opts = test_options();
      opts.grad_clip = clip;
      ShardedEngine engine(model, world(), plan, opts);
      engine.init_parameters(7);
      const auto before = engine.full_parameters();
      const std::vector<MicroBatch> micro = rank_batches(cfg.vocab_size);
      std::string message;
      try {
        engine.train_step(micro, 0);
      } catch (const NonFiniteLossError& e) {
        message = e.what();
      }
      CHECK_THAT(message, Contains("gradient norm is nan") && Contains("first non-finite gradient: " + target) &&
                              Contains("the optimizer step was skipped"));
      CHECK_THAT(message, !Contains("clip_coefficient") && !Contains("loss"));
      // nothing was updated: the parameters are the initial ones and no optimizer state exists
      const auto after = engine.full_parameters();
      for (const auto& [name, values] : before) CHECK(same_bits(after.at(name), values));
      CHECK(engine.optimizer_steps() == 0);
      bool zero_state = true;
      for (const auto& [name, m] : engine.full_optimizer_state().m)
        for (float x : m) zero_state = zero_state && x == 0.0f;
      CHECK(zero_state);

      // the same model without the poison trains: the loss and norm were finite, only the gradient was not
      GPT plain(cfg);
      ShardedEngine control(plain, world(), plan, opts);
      control.init_parameters(7);
      const StepStats s = control.train_step(micro, 0);
      CHECK(std::isfinite(s.loss));
      CHECK(std::isfinite(s.grad_norm));
    }
}
