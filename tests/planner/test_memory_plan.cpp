// The per-rank memory plan (planner/memory_plan.h) on a hand-sized model: every term against its
// closed form, per placement.
#include <catch2/catch.hpp>

#include "planner/memory_plan.h"
#include "planner/planner.h"

using namespace mfsdp;

namespace {

// unit "embedding": wte [64, 8] (512); unit "block": a [16, 8] and b [8, 16] Muon matrices (128
// each) and a norm [8]; unit "head": a norm [8]. 784 elements: 256 on Muon, 528 on AdamW.
ParamInventory tiny_inventory() {
  ParamInventory inv;
  inv.unit_names = {"embedding", "block", "head"};
  inv.params = {{"wte", {64, 8}, ParamRole::embedding, 0},
                {"a", {16, 8}, ParamRole::matrix, 1},
                {"b", {8, 16}, ParamRole::matrix, 1},
                {"ln", {8}, ParamRole::norm, 1},
                {"ln_f", {8}, ParamRole::norm, 2}};
  return inv;
}

const MemoryModel kModel{1, 8, 2, 64};

MemoryPlanOptions options(bool recompute = false, int prefetch = 0, bool overlap = false) {
  MemoryPlanOptions o;
  o.micro_batch = 1;
  o.seq = 4;
  o.recompute = recompute;
  o.prefetch_depth = prefetch;
  o.overlap_reduce = overlap;
  return o;
}

double seg(const ShardPlan& plan, int rank) {
  double n = 0;
  for (const UnitLayout& u : plan.units) n += static_cast<double>(u.segment_numel[static_cast<size_t>(rank)]);
  return n;
}

// Newton-Schulz of a [16, 8] or [8, 16] matrix: m = 8, n = 16: its update and one
// orthogonalization's scratch, 4 * (m n + 2 m n + 2 m^2) bytes.
constexpr double kNs = 4.0 * (3 * 8 * 16 + 2 * 8 * 8);  // 2048

}  // namespace

TEST_CASE("memory plan: persistent terms sum to the model's state over the ranks", "[memory]") {
  const ParamInventory inv = tiny_inventory();
  for (Placement pl : {Placement::matrixfsdp, Placement::fsdp2}) {
    const ShardPlan plan = make_plan(inv, 2, pl);
    double params = 0, state = 0, ns_ranks = 0;
    for (int r = 0; r < 2; ++r) {
      const MemoryPlan m = plan_memory(plan, kModel, options(), r);
      params += m.parameters;
      state += m.optimizer_state;
      CHECK(m.gradients == m.parameters);
      ns_ranks += m.newton_schulz > 0 ? 1 : 0;
      if (pl == Placement::fsdp2) CHECK(m.newton_schulz == kNs + 8.0 * 128);  // plus the gathered input and update
    }
    if (pl == Placement::matrixfsdp) {
      CHECK(params == 4.0 * 784);       // no padding under matrixfsdp
      CHECK(ns_ranks == 2);             // a and b have different owners (LPT)
    } else {
      CHECK(params >= 4.0 * 784);       // fsdp2 pads rows to a multiple of the world size
    }
    CHECK(state == 4.0 * 256 + 8.0 * 528);  // Muon momentum, AdamW m and v
  }
}

TEST_CASE("memory plan: resident placements hold the whole model on every rank", "[memory]") {
  const ParamInventory inv = tiny_inventory();
  const ShardPlan zero1 = make_plan(inv, 2, Placement::zero1), ddp = make_plan(inv, 2, Placement::ddp);
  double zero1_state = 0;
  for (int r = 0; r < 2; ++r) {
    const MemoryPlan z = plan_memory(zero1, kModel, options(), r), d = plan_memory(ddp, kModel, options(), r);
    CHECK(z.parameters == 4.0 * 784);
    CHECK(z.gradients == 4.0 * 784 + 4.0 * seg(zero1, r));  // the full gradients and the owner's reduced segment
    CHECK(d.gradients == 4.0 * 784);
    CHECK(z.gathered_params == 0);
    CHECK(z.gathered_grads == 0);
    zero1_state += z.optimizer_state;
    CHECK(d.optimizer_state == 4.0 * 256 + 8.0 * 528);
    CHECK(d.newton_schulz == kNs);
  }
  CHECK(zero1_state == 4.0 * 256 + 8.0 * 528);
}

TEST_CASE("memory plan: transient terms follow the schedule's options", "[memory]") {
  const ShardPlan plan = make_plan(tiny_inventory(), 2, Placement::matrixfsdp);
  const MemoryPlan base = plan_memory(plan, kModel, options(), 0);
  CHECK(base.gathered_params == 4.0 * (512 + 8));   // the embedding with the head (a tied head needs both)
  CHECK(base.gathered_grads == 4.0 * 512);          // the largest unit's full gradients
  const MemoryPlan ahead = plan_memory(plan, kModel, options(false, 1, true), 0);
  CHECK(ahead.gathered_params == 4.0 * (512 + 264));  // two consecutive units
  CHECK(ahead.gathered_grads == 2 * 4.0 * 512);       // an overlapped reduction keeps one more
  // Activations: 2 * (34 C + 5 h T) bytes per token per layer = 624, x 4 tokens x 1 layer.
  CHECK(base.activations == 624.0 * 4);
  // Recompute: the unit inputs (L x tokens x C x 4 B) plus one layer's activations.
  CHECK(plan_memory(plan, kModel, options(true), 0).activations == 1 * 4 * 8 * 4.0 + 624.0 * 4);
  // The classifier: 4 x (chunk rows x Vp + Vp x C + N x C + N) with 4 rows.
  CHECK(base.classifier == 4.0 * (4 * 64 + 64 * 8 + 4 * 8 + 4));
  CHECK(base.transient() == base.gathered_params + base.gathered_grads + base.activations + base.classifier);
  CHECK(base.total() == base.persistent() + base.transient());
  MemoryPlanOptions half = options();
  half.param_dtype = DType::bf16;
  half.compute_dtype = DType::bf16;
  const MemoryPlan h = plan_memory(plan, kModel, half, 0);
  CHECK(h.gathered_params == 6.0 * (512 + 8));  // the f32 unit buffer and its bf16 wire copy
  CHECK(h.activations == base.activations / 2);
}

TEST_CASE("memory plan: the worst rank and a rank out of range", "[memory]") {
  const ShardPlan plan = make_plan(tiny_inventory(), 3, Placement::matrixfsdp);
  int worst = -1;
  const MemoryPlan w = plan_memory_worst(plan, kModel, options(), &worst);
  for (int r = 0; r < 3; ++r) CHECK(plan_memory(plan, kModel, options(), r).total() <= w.total());
  CHECK(plan_memory(plan, kModel, options(), worst).total() == w.total());
  CHECK_THROWS_WITH(plan_memory(plan, kModel, options(), 3), Catch::Contains("rank 3 outside [0, 3)"));
}

TEST_CASE("memory plan: batched Newton-Schulz holds a chain of same-shape inputs", "[memory]") {
  // 6 same-shape [16, 8] matrices in one unit at 1 rank: batched, the 6 Muon inputs (updates) of one
  // chain plus one orthogonalization's scratch; the optimizer phase is the larger one here.
  ParamInventory inv;
  inv.unit_names = {"block"};
  for (int i = 0; i < 6; ++i) inv.params.push_back({"w" + std::to_string(i), {16, 8}, ParamRole::matrix, 0});
  const ShardPlan plan = make_plan(inv, 1, Placement::matrixfsdp);
  MemoryPlanOptions o = options();
  const double one = plan_memory(plan, kModel, o, 0).newton_schulz;
  CHECK(one == kNs);
  o.batch_orthogonalize = true;
  const MemoryPlan batched = plan_memory(plan, kModel, o, 0);
  CHECK(batched.newton_schulz == 4.0 * (6 * 128 + 2 * 128 + 2 * 64));
  CHECK(batched.transient() == std::max(batched.newton_schulz, batched.gathered_params + batched.gathered_grads +
                                                                   batched.activations + batched.classifier));
}
