// Balance: the LPT bound on Newton-Schulz FLOPs, the per-rank bytes target, and the baseline.
#include <catch2/catch.hpp>
#include <numeric>

#include "tests/planner/plan_checks.h"

using namespace mfsdp;
using namespace mfsdp::test;

namespace {
// Muon FLOPs per rank recomputed from the owners (independent of BalanceStats).
std::vector<double> muon_load(const ShardPlan& plan) {
  std::vector<double> load(plan.world_size, 0.0);
  for (const auto& s : plan.shards)
    if (s.optimizer == OptimizerKind::muon) load.at(s.owner) += shard_muon_flops(s, plan.options);
  return load;
}
}  // namespace

TEST_CASE("LPT max load <= 4/3 of the lower bound on GPT-2 sizes, N = 2..64",
          "[balance]") {
  for (const auto& cfg : {gpt2_124m(), gpt2_350m(), gpt2_774m(), gpt2_xl()})
    for (bool split : {false, true}) {
      const auto inv = gpt_inventory(cfg);
      PlannerOptions opt;
      opt.split_qkv = split;
      for (int N = 2; N <= 64; ++N) {
        const auto plan = make_plan(inv, N, Placement::matrixfsdp, opt);
        std::vector<double> items;
        for (const auto& s : plan.shards)
          if (s.optimizer == OptimizerKind::muon) items.push_back(shard_muon_flops(s, opt));
        std::sort(items.rbegin(), items.rend());
        const double total = std::accumulate(items.begin(), items.end(), 0.0);
        // Lower bounds on the optimum: the mean, the largest item and (pigeonhole) the N-th plus
        // (N+1)-th largest items, since two of the N+1 largest share a rank. The third term is
        // needed: GPT-2 124M at N=29 (24 items of 18, 12 of 14, 12 of 6, in units of 5*768^3)
        // has mean 23.2 but optimum 32 (12 of the 14s cannot fit two per rank on the 5 ranks
        // without an 18), above 4/3 of max(mean, largest) = 30.9 for any planner.
        double bound = std::max(total / N, items.front());
        if (static_cast<int>(items.size()) > N) bound = std::max(bound, items[N - 1] + items[N]);
        const auto load = muon_load(plan);
        const double mx = *std::max_element(load.begin(), load.end());
        INFO("layers " << cfg.n_layer << " split_qkv " << split << " N " << N << " max/LB "
                       << mx / bound);
        REQUIRE(mx <= 4.0 / 3.0 * bound * (1.0 + 1e-12));
        // The statistics agree with the independent recomputation (AdamW adds its elementwise cost).
        for (int r = 0; r < N; ++r) REQUIRE(plan.stats.rank_flops[r] >= load[r]);
        // Water-fill: a rank that received tail elements ends at most the cut-snapping slack
        // (tensors < T/(64N) elements, 16 B each) above the least-loaded rank.
        std::vector<int64_t> tail(N, 0);
        int64_t T = 0;
        for (const auto& s : plan.shards)
          if (s.optimizer == OptimizerKind::adamw)
            for (const auto& p : s.pieces) tail[p.rank] += p.numel, T += p.numel;
        const int64_t least =
            *std::min_element(plan.stats.rank_bytes.begin(), plan.stats.rank_bytes.end());
        for (int r = 0; r < N; ++r)
          if (tail[r] > 0) REQUIRE(plan.stats.rank_bytes[r] <= least + 16 * (2 * (T / (64 * N)) + 4));
      }
    }
}

TEST_CASE("GPT-2 124M: matrixfsdp max bytes within 1.10 x fsdp2 at N=4 and N=8", "[balance]") {
  const auto inv = gpt_inventory(gpt2_124m());
  for (int N : {4, 8}) {
    const auto m = make_plan(inv, N, Placement::matrixfsdp);
    const auto f = make_plan(inv, N, Placement::fsdp2);
    INFO("N " << N << " matrixfsdp max " << m.stats.bytes_max() << " fsdp2 max "
              << f.stats.bytes_max());
    REQUIRE(static_cast<double>(m.stats.bytes_max()) <=
            1.10 * static_cast<double>(f.stats.bytes_max()));
    // Closed form of the total: params+grads+state = 12 B per Muon element, 16 B per AdamW one.
    int64_t total = 0;
    for (int64_t b : m.stats.rank_bytes) total += b;
    REQUIRE(total == 12 * m.stats.muon_numel + 16 * m.stats.adamw_numel);
    // GPT-2 124M shapes divide 4 and 8: fsdp2 has no padding and equals the mean exactly.
    REQUIRE(f.stats.padding_numel == 0);
    REQUIRE(static_cast<double>(f.stats.bytes_max()) == f.stats.bytes_mean());
    // Newton-Schulz: every fsdp2 rank runs every matrix; matrixfsdp splits the work.
    REQUIRE(f.stats.flops_max() >= m.stats.flops_max() * (N - 1));
  }
}

TEST_CASE("LPT beats the round-robin baseline on FLOPs and bytes", "[balance]") {
  const auto inv = gpt_inventory(gpt2_124m());
  PlannerOptions rr;
  rr.round_robin = true;
  for (int N : {2, 3, 4, 6, 8, 16, 32}) {
    const auto lpt = make_plan(inv, N, Placement::matrixfsdp);
    const auto base = make_plan(inv, N, Placement::matrixfsdp, rr);
    INFO("N " << N);
    REQUIRE(lpt.stats.flops_ratio() <= base.stats.flops_ratio());
    REQUIRE(lpt.stats.bytes_ratio() < base.stats.bytes_ratio());
    REQUIRE(lpt.stats.flops_mean() == Approx(base.stats.flops_mean()).epsilon(1e-12));
  }
  // At N=4 the 48 GPT-2 matrices (12 of each of 4 shapes) balance perfectly.
  const auto p4 = make_plan(inv, 4, Placement::matrixfsdp);
  const auto load = muon_load(p4);
  for (double l : load) REQUIRE(l == load[0]);
  REQUIRE(p4.stats.bytes_ratio() < 1.0001);
}

TEST_CASE("per-unit segments: no unit concentrates on one rank when ranks suffice", "[balance]") {
  const auto inv = gpt_inventory(gpt2_124m());
  for (int N : {4, 8}) {
    const auto plan = make_plan(inv, N, Placement::matrixfsdp);
    for (size_t u = 1; u + 1 < plan.units.size(); ++u) {  // transformer blocks
      INFO("N " << N << " unit " << plan.units[u].name);
      int holders = 0;
      for (int64_t seg : plan.units[u].segment_numel) holders += seg > 0;
      REQUIRE(holders >= std::min(N, 3));
      // The largest segment is at most a c_fc plus a c_proj plus the unit's small tensors.
      REQUIRE(plan.stats.unit_segment_max_bytes[u] <= (3072 + 768) * 768 * 4 + 10000 * 4);
    }
    // The embedding unit (no matrices) is split evenly by the water-fill.
    REQUIRE(plan.stats.unit_ratio(0) < 1.01);
  }
}

TEST_CASE("the LPT bound holds for every orthogonalizer and the per-head split", "[balance]") {
  // The cost model follows the method: gram_newton_schulz makes the 4C x C MLP matrices cheaper
  // relative to the square ones, and split_heads cuts c_attn into n_head*3 small blocks, so the
  // owners change; the 4/3 bound on the max load must hold for each cost model.
  const auto cfg = gpt2_124m();
  const auto inv = gpt_inventory(cfg);
  const int64_t head_dim = cfg.n_embd / cfg.n_head;
  for (Orthogonalizer method :
       {Orthogonalizer::newton_schulz5, Orthogonalizer::polar_express, Orthogonalizer::gram_newton_schulz})
    for (int64_t hd : {int64_t{0}, head_dim}) {
      PlannerOptions opt;
      opt.orthogonalizer = method;
      opt.head_dim = hd;
      for (int N : {2, 3, 5, 8, 13, 29}) {
        const auto plan = make_plan(inv, N, Placement::matrixfsdp, opt);
        std::vector<double> items;
        for (const auto& s : plan.shards)
          if (s.optimizer == OptimizerKind::muon) items.push_back(shard_muon_flops(s, opt));
        std::sort(items.rbegin(), items.rend());
        double bound = std::max(std::accumulate(items.begin(), items.end(), 0.0) / N, items.front());
        if (static_cast<int>(items.size()) > N) bound = std::max(bound, items[N - 1] + items[N]);
        const auto load = muon_load(plan);
        INFO(orthogonalizer_name(method) << " head_dim " << hd << " N " << N);
        REQUIRE(*std::max_element(load.begin(), load.end()) <= 4.0 / 3.0 * bound * (1.0 + 1e-12));
      }
    }
  // The cost values themselves: c_attn [2304, 768] split per head is 36 blocks of [64, 768];
  // mlp.c_fc [3072, 768] under gram_newton_schulz costs 8 m^2 n + 28 m^3 with m = 768, n = 3072.
  PlannerOptions heads;
  heads.head_dim = head_dim;
  heads.orthogonalizer = Orthogonalizer::polar_express;
  const auto plan = make_plan(inv, 4, Placement::matrixfsdp, heads);
  REQUIRE(shard_muon_flops(plan.shard("h.0.attn.c_attn.weight"), heads) == 36.0 * muon_flops(64, 768, 5));
  PlannerOptions gram;
  gram.orthogonalizer = Orthogonalizer::gram_newton_schulz;
  const double m = 768, n = 3072;
  REQUIRE(shard_muon_flops(plan.shard("h.0.mlp.c_fc.weight"), gram) == 8 * m * m * n + 28 * m * m * m);
  // a plan's JSON keeps both options
  const ShardPlan back = ShardPlan::from_json(plan.to_json());
  REQUIRE(back.options == heads);
}

TEST_CASE("two MoE layers of 65536 equal experts plan in linear time, spread evenly over the ranks", "[balance][moe]") {
  // A quadratic owner spread took minutes here; the ctest timeout bounds this case.
  constexpr int kExperts = 65536, N = 8;
  ParamInventory inv;
  inv.unit_names = {"layer.0", "layer.1"};
  for (int u = 0; u < 2; ++u)
    for (int e = 0; e < kExperts; ++e)
      inv.params.push_back(ParamSpec{"layer." + std::to_string(u) + ".expert." + std::to_string(e) + ".w", {16, 8},
                                     ParamRole::matrix, u, 1, e});
  const ShardPlan plan = make_plan(inv, N, Placement::matrixfsdp);
  std::vector<std::vector<int>> owned(2, std::vector<int>(N, 0));
  for (const MatrixShard& s : plan.shards) ++owned.at(static_cast<size_t>(s.unit)).at(static_cast<size_t>(s.owner));
  for (int u = 0; u < 2; ++u)
    for (int r = 0; r < N; ++r) {
      INFO("unit " << u << " rank " << r);
      CHECK(owned[u][r] == kExperts / N);  // equal experts: each rank owns an equal share of each layer
    }
}
