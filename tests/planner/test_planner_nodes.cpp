// Owners spread over nodes (PlannerOptions::node_of_rank): a relabeling of ranks that keeps every
// rank's load and lowers the bytes a unit's gather sends from its busiest node.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>

#include "tests/planner/plan_checks.h"

using namespace mfsdp;
using namespace mfsdp::test;

namespace {
// Muon matrix elements of one unit on each node, recomputed from the owners.
std::vector<int64_t> unit_matrix_numel_per_node(const ShardPlan& plan, int unit, const std::vector<int>& node) {
  std::vector<int64_t> out(static_cast<size_t>(*std::max_element(node.begin(), node.end()) + 1), 0);
  for (const auto& s : plan.shards)
    if (s.unit == unit && s.optimizer == OptimizerKind::muon) out[static_cast<size_t>(node[s.owner])] += s.numel();
  return out;
}

// Each rank's (Muon FLOPs, matrix elements), sorted: equal for two plans whose owners differ only
// by rank labels. (The AdamW tail is water-filled after the relabeling, in rank order.)
std::vector<std::pair<double, int64_t>> rank_loads(const ShardPlan& plan) {
  std::vector<std::pair<double, int64_t>> out(static_cast<size_t>(plan.world_size));
  for (const auto& s : plan.shards)
    if (s.optimizer == OptimizerKind::muon)
      out[static_cast<size_t>(s.owner)].first += shard_muon_flops(s, plan.options),
          out[static_cast<size_t>(s.owner)].second += s.numel();
  std::sort(out.begin(), out.end());
  return out;
}

// Every piece of every shard (rank, offsets, length), hashed (FNV-1a 64): equal only for equal layouts.
uint64_t layout_digest(const ShardPlan& plan) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](int64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ static_cast<uint64_t>((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  for (const auto& s : plan.shards)
    for (const ShardPiece& p : s.pieces) {
      mix(p.rank);
      mix(p.segment_offset);
      mix(p.param_offset);
      mix(p.numel);
    }
  return h;
}

// One line per node layout of the GPT-2 124M plans: "W per_node digest".
std::string node_plan_digests() {
  std::string out;
  const auto inv = gpt_inventory(gpt2_124m());
  for (int W : {4, 8, 16})
    for (int per_node : {1, 2, W / 2}) {
      PlannerOptions opt;
      for (int r = 0; r < W; ++r) opt.node_of_rank.push_back(r / per_node);
      out += std::to_string(W) + " " + std::to_string(per_node) + " " +
             std::to_string(layout_digest(make_plan(inv, W, Placement::matrixfsdp, opt))) + "\n";
    }
  return out;
}

// sum over (unit, node) of (unit bytes on node)^2: what the relabeling lowers.
double node_square_sum(const ShardPlan& plan, const std::vector<int>& node) {
  double sum = 0;
  for (size_t u = 0; u < plan.units.size(); ++u)
    for (int64_t v : unit_matrix_numel_per_node(plan, static_cast<int>(u), node))
      sum += static_cast<double>(v) * static_cast<double>(v);
  return sum;
}
}  // namespace

TEST_CASE("one GPT-2 block on 2 nodes x 2 ranks: the two largest matrices on different nodes", "[nodes]") {
  // Block h.0 of width 768: c_attn 768x2304, attn c_proj 768x768, c_fc 768x3072, mlp c_proj
  // 3072x768. LPT puts the two 2359296-element matrices on ranks 0 and 1 (one node); the best split
  // of the four over two nodes pairs each with one of the others.
  const auto inv = gpt_inventory(gpt_cfg(1, 12, 768, 64, 65));
  const ShardPlan flat = make_plan(inv, 4, Placement::matrixfsdp);
  PlannerOptions opt;
  opt.node_of_rank = {0, 0, 1, 1};
  const ShardPlan spread = make_plan(inv, 4, Placement::matrixfsdp, opt);
  check_layout_elements(spread, inv);
  const int block = 1;
  REQUIRE(inv.unit_names[block] == "h.0");
  auto before = unit_matrix_numel_per_node(flat, block, opt.node_of_rank);
  auto after = unit_matrix_numel_per_node(spread, block, opt.node_of_rank);
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  CHECK(before == std::vector<int64_t>{768 * 2304 + 768 * 768, 2 * 768 * 3072});
  CHECK(after == std::vector<int64_t>{768 * 3072 + 768 * 768, 768 * 3072 + 768 * 2304});
  CHECK(rank_loads(spread) == rank_loads(flat));
  CHECK(spread.stats.bytes_max() == flat.stats.bytes_max());
}

TEST_CASE("node relabeling keeps every rank's load, never raises the node objective, and is a no-op on one node",
          "[nodes]") {
  for (const auto& cfg : {gpt2_124m(), gpt_cfg(6, 8, 512, 256, 1024)})
    for (int W : {4, 8, 16})
      for (int per_node : {1, 2, W / 2, W}) {
        INFO("layers " << cfg.n_layer << " W " << W << " ranks per node " << per_node);
        const auto inv = gpt_inventory(cfg);
        const ShardPlan flat = make_plan(inv, W, Placement::matrixfsdp);
        PlannerOptions opt;
        for (int r = 0; r < W; ++r) opt.node_of_rank.push_back(r / per_node);
        const ShardPlan spread = make_plan(inv, W, Placement::matrixfsdp, opt);
        CHECK(rank_loads(spread) == rank_loads(flat));
        // The tail fills the same levels: the fullest rank within a tensor edge of the flat plan's.
        CHECK(static_cast<double>(spread.stats.bytes_max()) <= 1.01 * static_cast<double>(flat.stats.bytes_max()));
        CHECK(node_square_sum(spread, opt.node_of_rank) <= node_square_sum(flat, opt.node_of_rank));
        if (per_node == W || per_node == 1) {  // one node, or a node per rank: nothing to trade
          for (size_t i = 0; i < flat.shards.size(); ++i) CHECK(spread.shards[i].pieces == flat.shards[i].pieces);
        }
      }
}

// Printed for the test below by another process of this binary.
TEST_CASE("print the node plans' digests", "[.node_plan_digests]") { std::printf("%s", node_plan_digests().c_str()); }

TEST_CASE("every process plans the same layout: two other processes agree with this one", "[nodes]") {
  // Each rank plans for itself, so the plan must not depend on anything of the process (addresses,
  // hash seeds, allocation order). Two fresh processes of this binary (own address space layouts)
  // print their digests.
  const std::string mine = node_plan_digests();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();  // popen's own would be sh
  for (int run = 0; run < 2; ++run) {
    FILE* child = ::popen(("'" + self + "' '[.node_plan_digests]' 2>&1").c_str(), "r");
    REQUIRE(child);
    std::string theirs;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, child)) > 0;) theirs.append(buf, n);
    CHECK(::pclose(child) == 0);
    CHECK(theirs.find(mine) != std::string::npos);  // between Catch's filter line and its summary
  }
}

TEST_CASE("node_of_rank of the wrong length or out of range is rejected", "[nodes]") {
  const auto inv = gpt_inventory(gpt_tiny());
  PlannerOptions opt;
  opt.node_of_rank = {0, 0, 1};
  CHECK_THROWS_WITH(make_plan(inv, 4, Placement::matrixfsdp, opt), Catch::Contains("node_of_rank"));
  opt.node_of_rank = {0, 0, 1, 4};
  CHECK_THROWS_WITH(make_plan(inv, 4, Placement::matrixfsdp, opt), Catch::Contains("node_of_rank"));
}

TEST_CASE("node_of_rank round-trips through the plan JSON", "[nodes]") {
  PlannerOptions opt;
  opt.node_of_rank = {0, 0, 1, 1};
  const ShardPlan plan = make_plan(gpt_inventory(gpt_tiny()), 4, Placement::matrixfsdp, opt);
  CHECK(ShardPlan::from_json(plan.to_json()).options.node_of_rank == opt.node_of_rank);
}
