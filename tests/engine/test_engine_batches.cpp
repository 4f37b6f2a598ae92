// How the engine takes its batches: token ids (inputs and targets) are range-checked on the host
// before they go to the engine's device, on every device, so a bad id stops the step with an
// error naming the micro-batch, the position, the value and the vocabulary size instead of
// reading or writing out of bounds in a CUDA embedding or cross-entropy. Runs on the test
// backend's device (MFSDP_TEST_BACKEND, engine_test_comm.h); every rank gets the same bad batch,
// so all of them stop before any collective.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "engine_test_comm.h"
#include "engine_test_util.h"
#include "planner/planner.h"

using namespace mfsdp;
using namespace mfsdp::testing;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kT = 16, kB = 2;

// kB sequences of valid ids; `bad_input` / `bad_target` >= 0 puts `value` at that flat position.
MicroBatch batch(int64_t bad_input, int64_t bad_target, int32_t value, int vocab) {
  std::vector<int32_t> g = global_tokens(0, kB, kT, vocab);
  MicroBatch mb = slice_batch(g, 0, kB, kT);
  if (bad_input >= 0) mb.tokens.data<int32_t>()[bad_input] = value;
  if (bad_target >= 0) mb.targets.data<int32_t>()[bad_target] = value;
  return mb;
}

}  // namespace

TEST_CASE("a token id outside the vocabulary is refused on the host, naming batch, position and value",
          "[engine][batches]") {
  const GPTConfig cfg = tiny_config();  // vocab_size 65, padded to 128 embedding rows
  GPT model(cfg);
  const ShardPlan plan = make_plan(model.inventory(), world().world_size(), Placement::matrixfsdp);
  ShardedEngine engine(model, world(), plan, test_options());
  engine.init_parameters(7);
  const std::string vocab = "outside the vocabulary [0, 65) of the model";
  // an input id in the padded rows (< 128) would be read silently on CUDA: refused too
  std::vector<MicroBatch> micro = {batch(-1, -1, 0, cfg.vocab_size), batch(kT + 3, -1, 100, cfg.vocab_size)};
  CHECK_THROWS_WITH(engine.train_step(micro, 4),
                    Contains("micro-batch 1 of step 4") && Contains("input token id 100 at position 19") &&
                        Contains("(sequence 1, column 3)") && Contains(vocab));
  micro = {batch(-1, 5, -2, cfg.vocab_size)};
  CHECK_THROWS_WITH(engine.train_step(micro, 0), Contains("micro-batch 0 of step 0") &&
                                                     Contains("target id -2 at position 5") && Contains(vocab));
  CHECK_THROWS_WITH(engine.eval_loss_sum({batch(-1, -1, 0, cfg.vocab_size), batch(0, -1, 65, cfg.vocab_size)}),
                    Contains("evaluate: batch 1") && Contains("input token id 65 at position 0"));
  // good batches still train, and the refused ones changed nothing (the same loss as a fresh engine)
  GPT fresh_model(cfg);
  ShardedEngine fresh(fresh_model, world(), plan, test_options());
  fresh.init_parameters(7);
  const std::vector<MicroBatch> good = {batch(-1, -1, 0, cfg.vocab_size)};
  const StepStats a = engine.train_step(good, 0), b = fresh.train_step(good, 0);
  CHECK(same_bits(a.loss, b.loss));
  CHECK(std::isfinite(a.loss));
}
