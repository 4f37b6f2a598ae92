// Layout invariants of every placement, edge-case world sizes, determinism and JSON round trips.
#include <catch2/catch.hpp>

#include "tests/planner/plan_checks.h"

using namespace mfsdp;
using namespace mfsdp::test;

namespace {
const Placement kAll[] = {Placement::matrixfsdp, Placement::fsdp2, Placement::zero1,
                          Placement::ddp};

ParamInventory one_unit(std::vector<ParamSpec> params) {
  ParamInventory inv;
  inv.unit_names = {"u"};
  inv.params = std::move(params);
  return inv;
}
}  // namespace

TEST_CASE("every placement stores each element exactly once (tiny GPT, many world sizes)",
          "[layout]") {
  for (bool tied : {true, false})
    for (int N : {1, 2, 3, 4, 5, 7, 8, 16, 64})
      for (Placement pl : kAll)
        for (bool rr : {false, true}) {
          const auto inv = gpt_inventory(gpt_tiny(tied));
          PlannerOptions opt;
          opt.round_robin = rr;
          INFO("tied " << tied << " N " << N << " placement " << placement_name(pl) << " rr "
                       << rr);
          check_layout_elements(make_plan(inv, N, pl, opt), inv);
        }
}

TEST_CASE("fsdp2 pads dims that do not divide the world size", "[layout]") {
  const auto inv = one_unit({ParamSpec{"a", {72, 3}, ParamRole::matrix, 0, 1},
                             ParamSpec{"b", {1, 4}, ParamRole::embedding, 0, 1},
                             ParamSpec{"c", {5}, ParamRole::bias, 0, 1}});
  const auto plan = make_plan(inv, 16, Placement::fsdp2);
  check_layout_elements(plan, inv);
  // Slots per rank: a 5 rows x 3, b 1 row x 4, c 1 element -> 20 elements on every rank.
  for (int r = 0; r < 16; ++r) REQUIRE(plan.units[0].segment_numel[r] == 20);
  const auto& a = plan.shard("a");
  REQUIRE(a.pieces.size() == 15);  // rank 15 holds no row of a
  REQUIRE(a.pieces[14].numel == 2 * 3);
  REQUIRE(a.pieces[14].param_offset == 14 * 5 * 3);
  REQUIRE(a.owner == -1);
  const auto& b = plan.shard("b");  // one row: rank 0 holds all of it
  REQUIRE(b.pieces.size() == 1);
  REQUIRE(b.pieces[0].segment_offset == 15);
  REQUIRE(b.owner == 0);
  REQUIRE(plan.shard("c").pieces.size() == 5);
  REQUIRE(plan.stats.padding_numel == (80 - 72) * 3 + 15 * 4 + 11);
  const auto p8 = make_plan(inv, 8, Placement::fsdp2);
  check_layout_elements(p8, inv);
  REQUIRE(p8.stats.padding_numel == 0 * 3 + 7 * 4 + 3);
}

TEST_CASE("world size 1 keeps everything whole on rank 0", "[layout]") {
  const auto inv = gpt_inventory(gpt_tiny());
  for (Placement pl : kAll) {
    const auto plan = make_plan(inv, 1, pl);
    check_layout_elements(plan, inv);
    for (const auto& s : plan.shards) {
      REQUIRE(s.pieces.size() == 1);
      REQUIRE(s.owner == (pl == Placement::ddp ? -1 : 0));
    }
    REQUIRE(plan.stats.empty_segments == 0);
    REQUIRE(plan.stats.padding_numel == 0);
  }
}

TEST_CASE("more ranks than matrices leaves empty segments", "[layout]") {
  SECTION("one matrix at N=8") {
    const auto inv = one_unit({ParamSpec{"w", {8, 4}, ParamRole::matrix, 0, 1}});
    const auto plan = make_plan(inv, 8, Placement::matrixfsdp);
    check_layout_elements(plan, inv);
    REQUIRE(plan.shard("w").owner == 0);
    REQUIRE(plan.units[0].segment_numel ==
            std::vector<int64_t>{32, 0, 0, 0, 0, 0, 0, 0});
    REQUIRE(plan.stats.empty_segments == 7);
    REQUIRE(plan.stats.flops_max() == muon_flops(8, 4, 5));
  }
  SECTION("two matrices in one unit at N=3 go to different ranks; the tail fills the third") {
    const auto inv = one_unit({ParamSpec{"w1", {6, 4}, ParamRole::matrix, 0, 1},
                               ParamSpec{"w2", {4, 4}, ParamRole::matrix, 0, 1},
                               ParamSpec{"b", {4}, ParamRole::bias, 0, 1}});
    const auto plan = make_plan(inv, 3, Placement::matrixfsdp);
    check_layout_elements(plan, inv);
    REQUIRE(plan.shard("w1").owner == 0);  // largest first, lowest rank on ties
    REQUIRE(plan.shard("w2").owner == 1);
    REQUIRE(plan.shard("b").owner == 2);  // the rank with no bytes takes the tail
    REQUIRE(plan.units[0].segment_numel == std::vector<int64_t>{24, 16, 4});
    REQUIRE(plan.stats.empty_segments == 0);
  }
}

TEST_CASE("round-robin baseline puts parameter k whole on rank k % N", "[layout]") {
  const auto inv = gpt_inventory(gpt_tiny());
  PlannerOptions rr;
  rr.round_robin = true;
  const auto plan = make_plan(inv, 5, Placement::matrixfsdp, rr);
  for (size_t k = 0; k < plan.shards.size(); ++k) {
    REQUIRE(plan.shards[k].owner == static_cast<int>(k % 5));
    REQUIRE(plan.shards[k].pieces.size() == 1);
  }
  REQUIRE(plan.stats.split_tensors == 0);
}

TEST_CASE("zero1 uses the matrixfsdp layout; ddp puts the unit on rank 0", "[layout]") {
  const auto inv = gpt_inventory(gpt2_124m());
  for (int N : {3, 8}) {
    const auto m = make_plan(inv, N, Placement::matrixfsdp);
    const auto z = make_plan(inv, N, Placement::zero1);
    REQUIRE(z.shards == m.shards);
    REQUIRE(z.units == m.units);
    REQUIRE_NOTHROW(z.validate());
    // zero1: full params + grads everywhere, state on owners.
    const int64_t total = m.stats.muon_numel + m.stats.adamw_numel;
    int64_t state = 0;
    for (int64_t b : z.stats.rank_bytes) state += b - total * 8;
    REQUIRE(state == m.stats.muon_numel * 4 + m.stats.adamw_numel * 8);
  }
  const auto d = make_plan(inv, 4, Placement::ddp);
  REQUIRE_NOTHROW(d.validate());
  for (const auto& u : d.units) {
    REQUIRE(u.segment_numel[0] == u.total_numel());
    REQUIRE(u.segment_numel[3] == 0);
  }
  const int64_t all = d.stats.muon_numel * 12 + d.stats.adamw_numel * 16;
  for (int64_t b : d.stats.rank_bytes) REQUIRE(b == all);
}

TEST_CASE("the embedding table splits across adjacent ranks under matrixfsdp", "[layout]") {
  const auto inv = gpt_inventory(gpt2_124m());
  const auto plan = make_plan(inv, 4, Placement::matrixfsdp);
  REQUIRE_NOTHROW(plan.validate());
  const auto& wte = plan.shard("wte.weight");
  REQUIRE(wte.owner == -1);
  REQUIRE(wte.pieces.size() == 4);  // ~31% of the model: spread, not one rank's burden
  const auto& unit = plan.units[wte.unit];
  for (size_t k = 0; k + 1 < wte.pieces.size(); ++k) {
    const auto& a = wte.pieces[k];
    const auto& b = wte.pieces[k + 1];
    REQUIRE(b.rank == a.rank + 1);
    // End of rank r's segment meets the start of rank r+1's in the unit buffer.
    REQUIRE(unit.segment_offset(a.rank) + a.segment_offset + a.numel ==
            unit.segment_offset(b.rank) + b.segment_offset);
  }
  // Small tensors are not cut into slivers.
  for (const auto& s : plan.shards)
    if (s.numel() < 100000) REQUIRE(s.pieces.size() == 1);
}

TEST_CASE("JSON round trip is lossless", "[layout]") {
  for (Placement pl : kAll)
    for (int N : {1, 3, 8}) {
      PlannerOptions opt;
      opt.split_qkv = N == 3;
      opt.ns_steps = N == 8 ? 4 : 5;
      const auto plan = make_plan(gpt_inventory(gpt2_124m()), N, pl, opt);
      const auto j = plan.to_json();
      const auto back = ShardPlan::from_json(nlohmann::json::parse(j.dump()));
      REQUIRE(back == plan);
      REQUIRE(back.to_json() == j);
      REQUIRE(back.to_json().dump() == j.dump());
    }
}

TEST_CASE("from_json and validate refuse broken plans, naming the field", "[layout]") {
  const auto plan = make_plan(gpt_inventory(gpt_tiny()), 3, Placement::matrixfsdp);
  const auto j = plan.to_json();
  {
    auto bad = j;
    bad.erase("world_size");
    REQUIRE_THROWS_WITH(ShardPlan::from_json(bad), Catch::Contains("world_size"));
  }
  {
    auto bad = j;
    bad["format"] = "other";
    REQUIRE_THROWS_WITH(ShardPlan::from_json(bad), Catch::Contains("format"));
  }
  {
    auto bad = j;
    bad["shards"][2]["pieces"][0] = {0, 0, 0};
    REQUIRE_THROWS_WITH(ShardPlan::from_json(bad), Catch::Contains("shards[2].pieces[0]"));
  }
  {
    auto bad = j;
    bad["shards"][2]["role"] = "weird";
    REQUIRE_THROWS_WITH(ShardPlan::from_json(bad), Catch::Contains("shards[2].role"));
  }
  SECTION("broken invariants") {
    auto p = plan;
    const auto& m = p.shard("h.0.mlp.c_fc.weight");
    const int idx = static_cast<int>(&m - p.shards.data());
    SECTION("overlap") {
      // Point the matrix at the start of the tail area it shares a segment with.
      auto& s = p.shards[idx];
      s.pieces[0].segment_offset = 1;
      REQUIRE_THROWS_AS(p.validate(), std::runtime_error);
      REQUIRE_THROWS_WITH(ShardPlan::from_json(p.to_json()), Catch::Contains("invalid plan"));
    }
    SECTION("uncovered elements") {
      p.shards[idx].pieces[0].numel -= 1;
      REQUIRE_THROWS_WITH(p.validate(), Catch::Contains("h.0.mlp.c_fc.weight"));
    }
    SECTION("wrong owner") {
      p.shards[idx].owner = (p.shards[idx].owner + 1) % 3;
      REQUIRE_THROWS_WITH(p.validate(), Catch::Contains("owner"));
    }
    SECTION("a segment larger than its pieces") {
      p.units[1].segment_numel[0] += 1;
      REQUIRE_THROWS_WITH(p.validate(), Catch::Contains("unit h.0 rank 0"));
    }
  }
}

TEST_CASE("GPT-2 XL plans at N=512, N up to 1024", "[layout]") {
  // (how long planning takes is mfsdp-plan's to print; the ctest timeout bounds a runaway)
  const auto inv = gpt_inventory(gpt2_xl());
  const auto plan = make_plan(inv, 512, Placement::matrixfsdp);
  REQUIRE_NOTHROW(plan.validate());
  REQUIRE(plan.stats.muon_params == 192);
  // 192 matrices on 512 ranks: each owned by its own rank.
  std::vector<int> per_rank(512, 0);
  for (const auto& s : plan.shards)
    if (s.optimizer == OptimizerKind::muon) per_rank[s.owner] += 1;
  REQUIRE(*std::max_element(per_rank.begin(), per_rank.end()) == 1);
  for (Placement pl : kAll) REQUIRE_NOTHROW(make_plan(inv, 1024, pl).validate());
  REQUIRE_NOTHROW(make_plan(inv, 512, Placement::fsdp2).validate());
}
