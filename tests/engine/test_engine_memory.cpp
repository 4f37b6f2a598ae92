// Memory in the steady state, under mpirun: after the first steps, training allocates no new raw
// blocks (every transient buffer is served by the block cache; on a GPU this means no cudaMalloc
// in the step) and the peak of tracked bytes stays flat. And ZeRO-3 memory outside the step:
// initialisation, loading and export touch only a rank's share, one unit gathered at a time.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <set>

#include "comm/mpi_backends.h"
#include "engine_test_util.h"
#include "planner/planner.h"
#include "runtime/block_cache.h"
#include "tests/forwarding_unit_model.h"

using namespace mfsdp;
using namespace mfsdp::testing;

TEST_CASE("no raw allocations and a flat memory peak after step 2", "[engine][memory]") {
  static std::unique_ptr<Communicator> comm = make_mpi_communicator();
  GPTConfig cfg = tiny_config(2, 128);
  cfg.vocab_size = 2048;  // logits [B*T, 2048] f32 = 2 MiB: blocks the host cache manages
  constexpr int64_t B = 8, T = 16;
  for (int variant = 0; variant < 4; ++variant) {
    // matrixfsdp, fsdp2, zero1, then matrixfsdp in bf16 with activation recompute
    const Placement placement = variant == 2 ? Placement::zero1 : variant == 1 ? Placement::fsdp2 : Placement::matrixfsdp;
    EngineOptions opts = test_options();
    if (variant == 3) {
      opts.param_dtype = opts.reduce_dtype = DType::bf16;
      opts.recompute_units = true;
    }
    GPT model(cfg);
    const ShardPlan plan = make_plan(model.inventory(), comm->world_size(), placement, PlannerOptions{});
    ShardedEngine engine(model, *comm, plan, opts);
    engine.init_parameters(7);
    int64_t raw_after_2 = 0, peak_after_2 = 0;
    for (int s = 0; s < 5; ++s) {
      auto g = global_tokens(s, comm->world_size() * B, T, cfg.vocab_size);
      engine.train_step({slice_batch(g, comm->rank() * B, B, T)}, s);
      if (s == 1) {
        raw_after_2 = block_cache(engine.device()).stats().raw_allocs;
        peak_after_2 = MemoryTracker::instance().peak_total(engine.device());
      }
    }
    INFO("placement " << placement_name(placement) << (variant == 3 ? " (bf16, recompute)" : ""));
    CHECK(block_cache(engine.device()).stats().raw_allocs == raw_after_2);
    CHECK(MemoryTracker::instance().peak_total(engine.device()) == peak_after_2);
    if (engine.device() == Device::CPU) {  // the host cache stays within the peak in use
      const BlockCacheStats blocks = block_cache(Device::CPU).stats();
      CHECK(blocks.in_use_bytes + blocks.cached_bytes <= blocks.peak_in_use_bytes);
    }
  }
}

TEST_CASE("activation recompute lowers the activation peak", "[engine][memory][recompute]") {
  static std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const GPTConfig cfg = tiny_config(4, 64);
  constexpr int64_t B = 8, T = 16;
  int64_t peak[2] = {0, 0};
  for (int recompute = 0; recompute < 2; ++recompute) {
    EngineOptions opts = test_options();
    opts.recompute_units = recompute == 1;
    GPT model(cfg);
    const ShardPlan plan = make_plan(model.inventory(), comm->world_size(), Placement::matrixfsdp);
    ShardedEngine engine(model, *comm, plan, opts);
    engine.init_parameters(7);
    auto g = global_tokens(0, comm->world_size() * B, T, cfg.vocab_size);
    MemoryTracker::instance().reset_peaks();
    engine.train_step({slice_batch(g, comm->rank() * B, B, T)}, 0);
    peak[recompute] = MemoryTracker::instance().peak(engine.device(), MemCategory::activations);
  }
  INFO("activation peak: " << peak[0] << " bytes kept, " << peak[1] << " bytes with recompute");
  // four blocks keep every intermediate without recompute; with it, one block's plus the inputs
  CHECK(peak[1] < peak[0] / 2);
}

namespace {

// Counts what the engine asks of the model's initialisation: elements per parameter.
class CountingInit : public ForwardingUnitModel {
 public:
  using ForwardingUnitModel::ForwardingUnitModel;
  void init_param(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count, float* out) const override {
    asked += count;
    ForwardingUnitModel::init_param(spec, seed, first, count, out);
  }
  mutable int64_t asked = 0;
};

}  // namespace

TEST_CASE("ZeRO-3 from start-up to export: a rank initialises, loads and streams only its share", "[engine][memory][zero3]") {
  static std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const GPTConfig cfg = tiny_config(3, 64);
  GPT gpt(cfg);
  CountingInit model(gpt);
  const ShardPlan plan = make_plan(model.inventory(), comm->world_size(), Placement::matrixfsdp);
  ShardedEngine engine(model, *comm, plan, test_options());
  int64_t stored = 0, total = 0;
  for (const UnitLayout& u : plan.units) {
    stored += u.segment_numel[static_cast<size_t>(comm->rank())];
    total += u.total_numel();
  }
  // Initialisation: exactly the elements this rank stores, never a whole tensor it does not own.
  engine.init_parameters(7);
  CHECK(model.asked == stored);
  if (comm->world_size() > 1) CHECK(model.asked < total);
  // Loading full tensors: only the parameters this rank stores a piece of are read.
  const auto full = engine.full_parameters();
  std::set<std::string> read;
  engine.load_parameters([&](const ParamSpec& spec) {
    read.insert(spec.name);
    return full.at(spec.name);
  });
  for (const MatrixShard& s : plan.shards) {
    bool mine = false;
    for (const ShardPiece& p : s.pieces) mine = mine || p.rank == comm->rank();
    CHECK(read.count(s.name) == (mine ? 1u : 0u));
  }
  CHECK(engine.full_parameters() == full);  // the same values after the load
  // Export: one unit gathered at a time, the f32 masters equal to the all-at-once gather.
  MemoryTracker::instance().reset_peaks();
  const int64_t before = MemoryTracker::instance().current(engine.device(), MemCategory::gathered_params);
  int64_t largest_unit = 0;
  for (const UnitLayout& u : plan.units) largest_unit = std::max(largest_unit, u.total_numel());
  {
    ShardedEngine::ParameterStream stream(engine);
    for (const ParamSpec& spec : model.inventory().params) CHECK(stream(spec) == full.at(spec.name));
  }
  CHECK(MemoryTracker::instance().peak(engine.device(), MemCategory::gathered_params) - before <= 4 * largest_unit);
  CHECK(MemoryTracker::instance().current(engine.device(), MemCategory::gathered_params) == before);
}
