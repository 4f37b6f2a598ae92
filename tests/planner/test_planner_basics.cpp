// Names, the cost model, fsdp2 row arithmetic, routing and the report helpers.
#include <catch2/catch.hpp>

#include "planner/report.h"
#include "runtime/core/format_bytes.h"
#include "tests/planner/plan_checks.h"

using namespace mfsdp;
using namespace mfsdp::test;

TEST_CASE("role, placement and optimizer names round-trip", "[basics]") {
  for (ParamRole r : {ParamRole::matrix, ParamRole::embedding, ParamRole::head, ParamRole::norm,
                      ParamRole::bias, ParamRole::router})
    REQUIRE(parse_param_role(param_role_name(r)) == r);
  REQUIRE(std::string(param_role_name(ParamRole::embedding)) == "embedding");
  REQUIRE_THROWS_WITH(parse_param_role("weights"), Catch::Contains("unknown role 'weights'"));
  for (Placement p : {Placement::matrixfsdp, Placement::fsdp2, Placement::zero1, Placement::ddp})
    REQUIRE(parse_placement(placement_name(p)) == p);
  REQUIRE(std::string(placement_name(Placement::fsdp2)) == "fsdp2");
  REQUIRE_THROWS_AS(parse_placement("zero3"), std::invalid_argument);
  REQUIRE(parse_optimizer("muon") == OptimizerKind::muon);
  REQUIRE(parse_optimizer("adamw") == OptimizerKind::adamw);
  REQUIRE_THROWS_AS(parse_optimizer("sgd"), std::invalid_argument);
}

TEST_CASE("muon_flops follows ns*(4 m^2 n + 2 m^3) with m <= n", "[basics]") {
  // m=2, n=3: 4*4*3 + 2*8 = 64 per step.
  REQUIRE(muon_flops(2, 3, 1) == 64.0);
  REQUIRE(muon_flops(3, 2, 1) == 64.0);  // tall matrices are transposed
  REQUIRE(muon_flops(2, 3, 5) == 320.0);
  REQUIRE(muon_flops(2, 3, 0) == 0.0);
  // GPT-2 c_fc [3072, 768], 5 steps: 5 * 18 * 768^3.
  REQUIRE(muon_flops(3072, 768, 5) == 5.0 * 18.0 * 768.0 * 768.0 * 768.0);
  REQUIRE(muon_flops(768, 768, 1) == 6.0 * 768.0 * 768.0 * 768.0);
  REQUIRE_THROWS_AS(muon_flops(0, 3, 5), std::invalid_argument);
  REQUIRE_THROWS_AS(muon_flops(2, 3, -1), std::invalid_argument);
  REQUIRE(owner_bytes_per_element(OptimizerKind::muon) == 12);
  REQUIRE(owner_bytes_per_element(OptimizerKind::adamw) == 16);
  REQUIRE(adamw_flops(10) == 10.0 * kAdamWFlopsPerElement);
}

TEST_CASE("split_qkv costs a fused QKV weight as three [C, C] blocks, still one owner", "[basics]") {
  const auto inv = gpt_inventory(gpt_tiny());
  PlannerOptions split;
  split.split_qkv = true;
  const auto a = make_plan(inv, 3, Placement::matrixfsdp);
  const auto b = make_plan(inv, 3, Placement::matrixfsdp, split);
  const auto& qa = a.shard("h.0.attn.c_attn.weight");
  const auto& qb = b.shard("h.0.attn.c_attn.weight");
  REQUIRE(qa.qkv_blocks == 3);
  REQUIRE(shard_muon_flops(qa, a.options) == muon_flops(96, 32, 5));
  REQUIRE(shard_muon_flops(qb, b.options) == 3.0 * muon_flops(32, 32, 5));
  REQUIRE(qb.pieces.size() == 1);
  REQUIRE(qb.owner == qb.pieces[0].rank);
  // Only the cost model changes: the non-QKV matrix costs are identical.
  REQUIRE(shard_muon_flops(b.shard("h.1.mlp.c_fc.weight"), b.options) == muon_flops(128, 32, 5));
}

TEST_CASE("fsdp2 row arithmetic pads dim 0 to a multiple of the world size", "[basics]") {
  MatrixShard s;
  s.name = "w";
  s.shape = {72, 5};
  // 72 rows at N=16: 5 rows per rank; ranks 0..13 full, rank 14 has 2 rows, rank 15 none.
  REQUIRE(s.fsdp2_rows_per_rank(16) == 5);
  for (int r = 0; r < 14; ++r) REQUIRE(s.fsdp2_rows_on(r, 16) == 5);
  REQUIRE(s.fsdp2_rows_on(14, 16) == 2);
  REQUIRE(s.fsdp2_rows_on(15, 16) == 0);
  REQUIRE(s.fsdp2_slot_numel(16) == 25);
  REQUIRE(s.fsdp2_padding_numel(16) == (80 - 72) * 5);
  // 1 row at N=8: rank 0 holds it, 7 rows of padding.
  s.shape = {1, 6};
  REQUIRE(s.fsdp2_rows_per_rank(8) == 1);
  REQUIRE(s.fsdp2_rows_on(0, 8) == 1);
  REQUIRE(s.fsdp2_rows_on(1, 8) == 0);
  REQUIRE(s.fsdp2_padding_numel(8) == 7 * 6);
  // 1-D tensors are rows of one element: 10 at N=4 -> 3, 3, 3, 1 (+2 padding).
  s.shape = {10};
  REQUIRE(s.row_numel() == 1);
  REQUIRE(s.fsdp2_rows_on(3, 4) == 1);
  REQUIRE(s.fsdp2_padding_numel(4) == 2);
  REQUIRE_THROWS_AS(s.fsdp2_rows_per_rank(0), std::invalid_argument);
}

TEST_CASE("routing by logical shape and role", "[basics]") {
  SECTION("GPT tied: the head is the embedding, counted once") {
    const auto cfg = gpt_tiny(true);
    const auto plan = make_plan(gpt_inventory(cfg), 4, Placement::matrixfsdp);
    REQUIRE(plan.find("lm_head.weight") == nullptr);
    REQUIRE(plan.shard("wte.weight").optimizer == OptimizerKind::adamw);
    REQUIRE(plan.shard("wpe.weight").optimizer == OptimizerKind::adamw);
    REQUIRE(plan.shard("h.1.ln_2.weight").optimizer == OptimizerKind::adamw);
    REQUIRE(plan.shard("h.1.attn.c_proj.weight").optimizer == OptimizerKind::muon);
    REQUIRE(plan.stats.muon_params == 4 * cfg.n_layer);
    REQUIRE(plan.stats.muon_numel == cfg.n_layer * 12LL * cfg.n_embd * cfg.n_embd);
    REQUIRE(plan.stats.muon_numel + plan.stats.adamw_numel == cfg.num_params());
    REQUIRE(plan.stats.adamw_params == static_cast<int>(plan.shards.size()) - 4 * cfg.n_layer);
    REQUIRE(routing_summary(plan) ==
            "muon: 8 tensors, 24576 elements; adamw: 20 tensors, " +
                std::to_string(cfg.num_params() - 24576) + " elements");
    REQUIRE_THROWS_WITH(plan.shard("lm_head.weight"), Catch::Contains("lm_head.weight"));
  }
  SECTION("GPT untied: the 2-D head goes to AdamW") {
    const auto plan = make_plan(gpt_inventory(gpt_tiny(false)), 4, Placement::matrixfsdp);
    REQUIRE(plan.shard("lm_head.weight").optimizer == OptimizerKind::adamw);
    REQUIRE(plan.shard("lm_head.weight").shape == std::vector<int64_t>{128, 32});
  }
  SECTION("bad inventories are refused with the parameter's name") {
    ParamInventory inv;
    inv.unit_names = {"u"};
    inv.params.push_back(ParamSpec{"v", {16}, ParamRole::matrix, 0, 1});
    REQUIRE_THROWS_WITH(make_plan(inv, 2, Placement::matrixfsdp),
                        Catch::Contains("v has role matrix but 1 dims"));
    inv.params[0] = ParamSpec{"w", {4, 0}, ParamRole::matrix, 0, 1};
    REQUIRE_THROWS_WITH(make_plan(inv, 2, Placement::fsdp2), Catch::Contains("dim 0 < 1"));
    inv.params[0] = ParamSpec{"w", {4, 4}, ParamRole::matrix, 1, 1};
    REQUIRE_THROWS_WITH(make_plan(inv, 2, Placement::fsdp2), Catch::Contains("unit 1 not in"));
    inv.params[0] = ParamSpec{"w", {4, 4}, ParamRole::matrix, 0, 3};
    REQUIRE_THROWS_WITH(make_plan(inv, 2, Placement::fsdp2),
                        Catch::Contains("qkv_blocks 3 does not divide rows 4"));
    inv.params[0] = ParamSpec{"w", {4, 4}, ParamRole::matrix, 0, 1};
    inv.params.push_back(inv.params[0]);
    REQUIRE_THROWS_WITH(make_plan(inv, 2, Placement::fsdp2), Catch::Contains("w appears twice"));
    inv.params.pop_back();
    REQUIRE_THROWS_WITH(make_plan(inv, 0, Placement::fsdp2), Catch::Contains("world size 0"));
    PlannerOptions bad;
    bad.ns_steps = -1;
    REQUIRE_THROWS_AS(make_plan(inv, 2, Placement::fsdp2, bad), std::invalid_argument);
  }
}

TEST_CASE("report helpers format and align", "[basics]") {
  REQUIRE(format_count(1234567) == "1,234,567");
  REQUIRE(format_count(12) == "12");
  REQUIRE(format_count(-1000) == "-1,000");
  REQUIRE(format_bytes(512) == "512 B");
  REQUIRE(format_bytes(1536) == "1.50 KiB");
  REQUIRE(format_bytes(3.0 * 1024 * 1024 * 1024) == "3.00 GiB");
  REQUIRE(format_flops(1.52e12) == "1.52 TFLOP");
  REQUIRE(format_ratio(1.0416) == "1.042");
  TextTable t({"name", "value"});
  t.add_row({"a", "1"});
  t.add_row({"longer", "12,345"});
  REQUIRE(t.str() ==
          "name     value\n"
          "--------------\n"
          "a            1\n"
          "longer  12,345\n");
  REQUIRE_THROWS_AS(t.add_row({"x"}), std::invalid_argument);
  const auto plan = make_plan(gpt_inventory(gpt_tiny()), 2, Placement::matrixfsdp);
  const std::string units = unit_table(plan);
  REQUIRE(units.find("embedding") != std::string::npos);
  REQUIRE(units.find("head") != std::string::npos);
  REQUIRE(rank_table(plan).find("optimizer FLOPs") != std::string::npos);
  REQUIRE(balance_table({{"lpt", &plan}}).find("bytes max/mean") != std::string::npos);
}

TEST_CASE("orthogonalizer_flops: standard evaluation counted per product; Gram NS counted per product", "[basics]") {
  // One standard iteration on the short side m: A = X X^T (m x n x m), B = A A (m x m x m),
  // X' = B X (m x m x n), 2*M*N*K each; the quintic's scalar terms are elementwise.
  auto standard = [](double r, double c, int steps) {
    const double m = std::min(r, c), n = std::max(r, c);
    return steps * (2 * m * n * m + 2 * m * m * m + 2 * m * m * n);
  };
  for (auto [r, c] : {std::pair<int64_t, int64_t>{768, 3072}, {3072, 768}, {768, 768}, {2, 3}})
    for (int s : {0, 1, 5, 8}) {
      const double want = standard(static_cast<double>(r), static_cast<double>(c), s);
      REQUIRE(orthogonalizer_flops(r, c, s, Orthogonalizer::newton_schulz5) == want);
      REQUIRE(orthogonalizer_flops(r, c, s, Orthogonalizer::polar_express) == want);
      REQUIRE(muon_flops(r, c, s) == want);
    }
  REQUIRE(muon_flops(768, 3072, 5) == 40768634880.0);  // mfsdp-plan's 40.77 GFLOP for a GPT-2 MLP matrix
  // Walk the Gram iteration product by product (2*M*N*K each) and compare.
  auto walk = [](double m, double n, int steps) {
    if (steps == 0) return 0.0;
    double f = 2 * m * m * n;  // R0 = X X^T
    bool have_q = false;
    for (int t = 0; t < steps; ++t) {
      if (t > 0 && gram_newton_schulz_restarts_before(t)) {
        f += 2 * m * m * n + 2 * m * m * n;  // X <- Q X, R <- X X^T
        have_q = false;
      }
      f += 2 * m * m * m;                // R R
      if (have_q) f += 2 * m * m * m;    // Q Z
      have_q = true;
      if (t + 1 < steps && !gram_newton_schulz_restarts_before(t + 1)) f += 4 * m * m * m;  // R Z, Z RZ
    }
    return f + 2 * m * m * n;  // X <- Q X
  };
  for (auto [r, c] : {std::pair<int64_t, int64_t>{768, 3072}, {3072, 768}, {768, 768}, {48, 16}})
    for (int s : {0, 1, 2, 5, 8, 11}) {
      const double m = static_cast<double>(std::min(r, c)), n = static_cast<double>(std::max(r, c));
      REQUIRE(orthogonalizer_flops(r, c, s, Orthogonalizer::gram_newton_schulz) == walk(m, n, s));
    }
  const double m = 768.0;
  // 5 steps, one restart: 8 m^2 n + 28 m^3. Rectangular 768x3072 (n = 4m): 60 m^3 vs 90 m^3.
  REQUIRE(orthogonalizer_flops(768, 3072, 5, Orthogonalizer::gram_newton_schulz) == 60.0 * m * m * m);
  REQUIRE(muon_flops(768, 3072, 5) == 90.0 * m * m * m);
  // Square: 36 m^3 vs 30 m^3 (the Gram form costs more).
  REQUIRE(orthogonalizer_flops(768, 768, 5, Orthogonalizer::gram_newton_schulz) == 36.0 * m * m * m);
  // One step is the same work either way: R, R R, Q X.
  REQUIRE(orthogonalizer_flops(2, 3, 1, Orthogonalizer::gram_newton_schulz) == muon_flops(2, 3, 1));
  REQUIRE_THROWS_AS(orthogonalizer_flops(0, 3, 5, Orthogonalizer::gram_newton_schulz), std::invalid_argument);
  REQUIRE_THROWS_AS(orthogonalizer_flops(2, 3, -1, Orthogonalizer::polar_express), std::invalid_argument);
}
