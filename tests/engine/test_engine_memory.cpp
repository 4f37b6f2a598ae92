// Memory in the steady state, under mpirun: after the first steps, training allocates no new raw
// blocks (every transient buffer is served by the block cache; on a GPU this means no cudaMalloc
// in the step) and the peak of tracked bytes stays flat.
#include <catch2/catch.hpp>

#include <memory>

#include "comm/mpi_backends.h"
#include "engine_test_util.h"
#include "planner/planner.h"
#include "runtime/block_cache.h"

using namespace mfsdp;
using namespace mfsdp::testing;

TEST_CASE("no raw allocations and a flat memory peak after step 2", "[engine][memory]") {
  static std::unique_ptr<Communicator> comm = make_mpi_communicator();
  GPTConfig cfg = tiny_config(2, 128);
  cfg.vocab_size = 2048;  // logits [B*T, 2048] f32 = 2 MiB: blocks the host cache manages
  constexpr int64_t B = 8, T = 16;
  for (Placement placement : {Placement::matrixfsdp, Placement::fsdp2, Placement::zero1}) {
    GPT model(cfg);
    const ShardPlan plan = make_plan(model.inventory(), comm->world_size(), placement, PlannerOptions{5, false, false});
    ShardedEngine engine(model, *comm, plan, test_options());
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
    INFO("placement " << placement_name(placement));
    CHECK(block_cache(engine.device()).stats().raw_allocs == raw_after_2);
    CHECK(MemoryTracker::instance().peak_total(engine.device()) == peak_after_2);
  }
}
