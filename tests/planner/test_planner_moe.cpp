// Plans for a Mixture-of-Experts inventory: every expert matrix owned whole by one rank, routers on
// AdamW (or Muon when asked), and Newton-Schulz balanced over many same-shape expert matrices.
#include <catch2/catch.hpp>
#include <algorithm>
#include <map>
#include <set>
#include <numeric>
#include <sstream>

#include "models/moe_spec.h"
#include "planner/cost_model.h"
#include "planner/report.h"
#include "tests/planner/plan_checks.h"

using namespace mfsdp;
using namespace mfsdp::test;

namespace {

// 4 layers of 64 experts (3 matrices each), Llama attention, a shared expert.
MoeConfig moe_64x4() {
  MoeConfig c;
  c.n_layer = 4;
  c.n_head = 8;
  c.n_kv_head = 4;
  c.n_embd = 512;
  c.seq_len = 1024;
  c.vocab_size = 1024;
  c.num_experts = 64;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 256;
  c.shared_expert_intermediate_size = 1024;
  return c;
}

// Newton-Schulz FLOPs per rank, summed from the plan's Muon shards on their owners with
// muon_flops(rows, cols) (the cost model's formula, not the planner's stats).
std::vector<double> ns_flops_per_rank(const ShardPlan& plan, int world) {
  std::vector<double> per(world, 0.0);
  for (const MatrixShard& s : plan.shards)
    if (s.optimizer == OptimizerKind::muon) per.at(s.owner) += muon_flops(s.shape[0], s.shape[1], 5);
  return per;
}

}  // namespace

TEST_CASE("MoE: 64 experts x 3 matrices x 4 layers at world 8, Newton-Schulz max/mean <= 1.05", "[moe]") {
  const MoeConfig cfg = moe_64x4();
  const ParamInventory inv = moe_inventory(cfg);
  const int world = 8;
  const ShardPlan plan = make_plan(inv, world, Placement::matrixfsdp);
  check_layout_elements(plan, inv);
  int experts = 0;
  for (const MatrixShard& s : plan.shards) {
    INFO(s.name);
    if (s.name.find(".mlp.experts.") != std::string::npos) {
      ++experts;
      CHECK(s.optimizer == OptimizerKind::muon);
      // whole on its owner: one piece, on the owner's rank, of every element
      REQUIRE(s.pieces.size() == 1);
      CHECK(s.pieces[0].rank == s.owner);
      CHECK(s.pieces[0].numel == s.numel());
    }
    if (s.name.ends_with("mlp.gate.weight") || s.name.ends_with("shared_expert_gate.weight"))
      CHECK(s.optimizer == OptimizerKind::adamw);
  }
  CHECK(experts == 64 * 3 * 4);
  // the expert matrices cost the same, so the owners spread them over the ranks in each layer:
  // a layer's Muon matrix elements per rank differ by at most one expert matrix's plus the layer's
  // largest other matrix (the attention and shared-expert matrices LPT places first)
  for (int u = 0; u < static_cast<int>(plan.units.size()); ++u) {
    std::vector<int64_t> elements(world, 0);
    int64_t largest_other = 0, expert_matrix = 0;
    for (const MatrixShard& s : plan.shards)
      if (s.unit == u && s.optimizer == OptimizerKind::muon) {
        elements[static_cast<size_t>(s.owner)] += s.numel();
        if (s.name.find(".mlp.experts.") != std::string::npos) expert_matrix = s.numel();
        else largest_other = std::max(largest_other, s.numel());
      }
    if (!expert_matrix) continue;
    INFO("unit " << plan.units[static_cast<size_t>(u)].name);
    CHECK(*std::max_element(elements.begin(), elements.end()) - *std::min_element(elements.begin(), elements.end()) <=
          expert_matrix + largest_other);
  }
  // under expert parallelism an expert's three matrices are one item: one owner, 64 / 8 experts per rank and layer
  PlannerOptions ep;
  ep.expert_parallel = true;
  const ShardPlan pe = make_plan(inv, world, Placement::matrixfsdp, ep);
  std::map<std::pair<int, int>, std::set<int>> owners_of_expert;  // (unit, expert) -> owners
  std::map<std::pair<int, int>, std::set<int>> experts_of_rank;   // (unit, owner) -> experts
  for (const MatrixShard& s : pe.shards)
    if (s.expert >= 0) {
      owners_of_expert[{s.unit, s.expert}].insert(s.owner);
      experts_of_rank[{s.unit, s.owner}].insert(s.expert);
    }
  CHECK(owners_of_expert.size() == 64 * 4);
  for (const auto& [key, owners] : owners_of_expert) CHECK(owners.size() == 1);
  for (const auto& [key, held] : experts_of_rank) CHECK(held.size() == 64 / world);
  const std::vector<double> ns = ns_flops_per_rank(plan, world);
  const double total = std::accumulate(ns.begin(), ns.end(), 0.0);
  const double max_over_mean = *std::max_element(ns.begin(), ns.end()) / (total / world);
  INFO("Newton-Schulz max/mean " << max_over_mean);
  CHECK(max_over_mean <= 1.05);
  CHECK(plan.stats.muon_params == 4 * (4 + 64 * 3 + 3));

  // router_on_muon: the routers become Muon matrices too; the shared expert's gate stays AdamW
  MoeConfig muon_router = cfg;
  muon_router.router_on_muon = true;
  const ShardPlan p2 = make_plan(moe_inventory(muon_router), world, Placement::matrixfsdp);
  CHECK(p2.shard("model.layers.2.mlp.gate.weight").optimizer == OptimizerKind::muon);
  CHECK(p2.shard("model.layers.2.mlp.shared_expert_gate.weight").optimizer == OptimizerKind::adamw);
  check_layout_elements(make_plan(inv, 3, Placement::fsdp2), inv);
}

TEST_CASE("MoE: mfsdp-plan's experts table lists every expert matrix under its owner", "[moe]") {
  const ShardPlan plan = make_plan(moe_inventory(moe_64x4()), 8, Placement::matrixfsdp);
  const std::string table = expert_table(plan);
  INFO(table);
  std::vector<std::string> letters(8);  // per rank, the g/u/d letters the table shows
  std::map<std::string, int> owner;     // "layer.expert" + letter -> owner, from the plan
  for (const MatrixShard& s : plan.shards) {
    const auto at = s.name.find(".mlp.experts.");
    if (at == std::string::npos) continue;
    const std::string layer = s.name.substr(13, s.name.find('.', 13) - 13);
    const std::string rest = s.name.substr(at + 13);
    owner[layer + "." + rest.substr(0, rest.find('.')) + rest[rest.find('.') + 1]] = s.owner;
  }
  REQUIRE(owner.size() == 64 * 3 * 4);
  std::istringstream lines(table);
  std::string line;
  int listed = 0;
  while (std::getline(lines, line)) {
    if (!line.starts_with("rank ") || line.find(':') == std::string::npos || line.starts_with("rank  ")) continue;
    const int rank = std::stoi(line.substr(5));
    std::istringstream items(line.substr(line.find(':') + 2));
    std::string item;
    while (items >> item) {
      const auto colon = item.find(':');
      const std::string expert = item.substr(0, colon);
      for (char m : colon == std::string::npos ? std::string("gud") : item.substr(colon + 1)) {
        INFO(expert << m);
        CHECK(owner.at(expert + m) == rank);
        ++listed;
      }
    }
  }
  CHECK(listed == 64 * 3 * 4);
  CHECK(expert_table(make_plan(llama_inventory(LlamaConfig{}), 4, Placement::matrixfsdp)).empty());
}

TEST_CASE("MoE: expert parallelism keeps each expert whole on one owner, at its segments' tails", "[moe]") {
  const MoeConfig cfg = moe_64x4();
  const ParamInventory inv = moe_inventory(cfg);
  PlannerOptions opt;
  opt.expert_parallel = true;
  const int world = 8;
  const ShardPlan plan = make_plan(inv, world, Placement::matrixfsdp, opt);
  check_layout_elements(plan, inv);
  std::map<int, std::set<int>> owners;  // expert -> the ranks of its matrices
  for (const MatrixShard& s : plan.shards)
    if (s.expert >= 0) owners[s.expert].insert(s.owner);
  REQUIRE(owners.size() == 64 * 4);
  for (const auto& [expert, ranks] : owners) {
    INFO("expert " << expert);
    CHECK(ranks.size() == 1);
  }
  // the moved leading part of each segment is the segment less its expert matrices
  for (size_t u = 0; u < plan.units.size(); ++u)
    for (int r = 0; r < world; ++r) {
      int64_t experts = 0;
      for (const MatrixShard& s : plan.shards)
        if (s.unit == static_cast<int>(u) && s.expert >= 0 && s.owner == r) experts += s.numel();
      CHECK(plan.units[u].gathered_numel[r] == plan.units[u].segment_numel[r] - experts);
    }
  const std::vector<double> ns = ns_flops_per_rank(plan, world);
  const double total = std::accumulate(ns.begin(), ns.end(), 0.0);
  const double max_over_mean = *std::max_element(ns.begin(), ns.end()) / (total / world);
  INFO("Newton-Schulz max/mean with whole experts " << max_over_mean);
  CHECK(max_over_mean <= 1.05);
  CHECK(expert_table(plan).find("whole experts") != std::string::npos);
  // a JSON round trip keeps the expert numbers, the option and the gathered parts
  const ShardPlan back = ShardPlan::from_json(plan.to_json());
  CHECK(back == plan);
  // without the option the plan has no tails and moves whole segments
  const ShardPlan gathered = make_plan(inv, world, Placement::matrixfsdp);
  for (const UnitLayout& u : gathered.units) CHECK(u.gathered_numel == u.segment_numel);
  CHECK_THROWS_WITH(make_plan(inv, world, Placement::fsdp2, opt), Catch::Contains("expert_parallel needs placement matrixfsdp"));
  opt.round_robin = true;
  CHECK_THROWS_WITH(make_plan(inv, world, Placement::matrixfsdp, opt), Catch::Contains("round-robin"));
}

