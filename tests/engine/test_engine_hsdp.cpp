// HSDP (replicate x shard) under mpirun: a world of W = R*S ranks as R replicas of S-rank shard
// groups (comm/comm_factory.h make_hsdp_groups). Every replica must end bitwise identical
// (memcmp) to world-1 training with W*A micro-batches: parameters, optimizer state, losses, grad
// norms and the state fingerprint. Run at W = 4 (R = 2 x S = 2) and W = 6 (2 x 3, and 3 x 2).
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>

#include "comm/comm_factory.h"
#include "comm/mpi_backends.h"
#include "engine_test_util.h"
#include "planner/planner.h"

using namespace mfsdp;
using namespace mfsdp::testing;

namespace {

constexpr int64_t kGlobalSeqs = 24;  // divisible by W*A for W in {4, 6}, A in {1, 2}
constexpr int64_t kT = 16;
constexpr int kSteps = 3;
constexpr uint64_t kSeed = 7;

struct Run {
  std::map<std::string, std::vector<float>> params;
  ShardedEngine::FullOptimizerState state;
  std::vector<StepStats> stats;
  std::string fingerprint;
  CommCounters shard_counters, replica_counters;
};

// kSteps steps with `accum` micro-batches of B sequences per rank; world rank g = q*S + s feeds
// global micro-batch k*W + g. `replicas` null: a plain (unreplicated) engine on `shard`.
Run train(Communicator& shard, Communicator* replicas, Placement p, int accum, int64_t B,
          const EngineOptions& opts = test_options()) {
  const int S = shard.world_size(), R = replicas ? replicas->world_size() : 1, W = R * S;
  const int g = (replicas ? replicas->rank() : 0) * S + shard.rank();
  const GPTConfig cfg = tiny_config();
  GPT model(cfg);
  const ShardPlan plan = make_plan(model.inventory(), S, p);
  ShardedEngine engine(model, shard, plan, opts, replicas);
  engine.init_parameters(kSeed);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const auto batch = global_tokens(step, static_cast<int64_t>(W) * accum * B, kT, cfg.vocab_size);
    std::vector<MicroBatch> micro;
    for (int k = 0; k < accum; ++k) micro.push_back(slice_batch(batch, (static_cast<int64_t>(k) * W + g) * B, B, kT));
    run.stats.push_back(engine.train_step(micro, step));
  }
  run.shard_counters = shard.counters();
  if (replicas) run.replica_counters = replicas->counters();
  run.fingerprint = engine.state_fingerprint();
  run.params = engine.full_parameters();
  run.state = engine.full_optimizer_state();
  return run;
}

void check_bitwise(const Run& run, const Run& ref) {
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s << ": loss " << run.stats[s].loss << " vs " << ref.stats[s].loss);
    CHECK(same_bits(run.stats[s].loss, ref.stats[s].loss));
    CHECK(same_bits(run.stats[s].grad_norm, ref.stats[s].grad_norm));
    CHECK(run.stats[s].tokens == ref.stats[s].tokens);
  }
  for (const auto& [name, want] : ref.params) {
    INFO(name);
    CHECK(same_bits(run.params.at(name), want));
    CHECK(same_bits(run.state.m.at(name), ref.state.m.at(name)));
    if (ref.state.v.count(name)) CHECK(same_bits(run.state.v.at(name), ref.state.v.at(name)));
  }
  CHECK(run.fingerprint == ref.fingerprint);
}

// Every replica count R that divides the world into shard groups of >= 2 ranks.
std::vector<int> replica_counts(int W) {
  std::vector<int> out;
  for (int R = 2; R <= W / 2; ++R)
    if (W % R == 0) out.push_back(R);
  return out;
}

}  // namespace

TEST_CASE("HSDP training is bitwise identical to world 1 on every replica", "[engine][hsdp][bitwise]") {
  int W = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  auto self = make_mpi_communicator(MPI_COMM_SELF);
  REQUIRE_FALSE(replica_counts(W).empty());
  for (int R : replica_counts(W)) {
    HsdpGroups groups = make_hsdp_groups(CommBackend::mpi, R);
    REQUIRE(groups.shard->world_size() * groups.replica->world_size() == W);
    for (Placement p : {Placement::matrixfsdp, Placement::fsdp2, Placement::zero1})
      for (int A : {1, 2}) {
        if (A > 1 && p == Placement::zero1) continue;  // resident gradients: the guarantee is for A = 1
        const int64_t B = kGlobalSeqs / (static_cast<int64_t>(W) * A);
        INFO(placement_name(p) << ", R = " << R << " x S = " << W / R << ", A = " << A << ", B = " << B);
        const Run ref = train(*self, nullptr, Placement::matrixfsdp, W * A, B);  // world 1, W*A micro-batches
        groups.shard->reset_counters();
        groups.replica->reset_counters();
        const Run run = train(*groups.shard, groups.replica.get(), p, A, B);
        check_bitwise(run, ref);
        // The replica chain moves owned gradient bytes between replicas in the grad_reduce phase.
        CHECK(run.replica_counters.at(CommPhase::grad_reduce).bytes_sent +
                  run.replica_counters.at(CommPhase::grad_reduce).bytes_received > 0);
        CHECK(run.replica_counters.at(CommPhase::fwd_gather).calls == 0);  // gathers stay in the shard group
        // overlap_reduce asked for: the replica chain stays blocking, the result the same
        EngineOptions overlap = test_options();
        overlap.overlap_reduce = Toggle::on;
        check_bitwise(train(*groups.shard, groups.replica.get(), p, A, B, overlap), ref);
      }
  }
}

TEST_CASE("HSDP refuses ddp and a replica count that does not divide the world", "[engine][hsdp][errors]") {
  int W = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const EngineOptions o = test_options();
  auto refused_field = [&](Placement p, int replicas) {
    try {
      resolve(o, Device::CPU, p, replicas, ModelFacts{});
    } catch (const OptionError& e) {
      return std::string(kOptionFieldNames.name(e.field()));
    }
    return std::string("accepted");
  };
  CHECK(refused_field(Placement::ddp, 2) == "replicas");
  CHECK(refused_field(Placement::matrixfsdp, 0) == "replicas");
  CHECK(refused_field(Placement::fsdp2, 2) == "accepted");
  CHECK(resolve(o, Device::CPU, Placement::fsdp2, 2, ModelFacts{}).traits.replicated);
  CHECK_FALSE(resolve(o, Device::CPU, Placement::fsdp2, 1, ModelFacts{}).traits.replicated);
  CHECK_FALSE(placement_traits(Placement::ddp, true).replicated);  // ddp's row is all replicas already
  CHECK_THROWS_AS(make_hsdp_groups(CommBackend::mpi, W + 1), std::invalid_argument);
}
