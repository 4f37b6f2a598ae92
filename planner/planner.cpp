#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

namespace mfsdp {

void validate_inventory(const ParamInventory& inv) {
  auto fail = [](const std::string& m) { throw std::invalid_argument("[make_plan] " + m); };
  if (inv.unit_names.empty()) fail("inventory has no units");
  std::set<std::string> names;
  const int U = static_cast<int>(inv.unit_names.size());
  for (const auto& p : inv.params) {
    if (p.name.empty()) fail("a parameter has an empty name");
    if (!names.insert(p.name).second) fail("parameter " + p.name + " appears twice");
    if (p.unit < 0 || p.unit >= U)
      fail("parameter " + p.name + ": unit " + std::to_string(p.unit) + " not in [0, " +
           std::to_string(U) + ")");
    for (int64_t d : p.shape)
      if (d < 1) fail("parameter " + p.name + ": dim " + std::to_string(d) + " < 1");
    if (p.qkv_blocks < 1)
      fail("parameter " + p.name + ": qkv_blocks " + std::to_string(p.qkv_blocks) + " < 1");
    if (p.role == ParamRole::matrix) {
      if (p.shape.size() != 2)
        fail("parameter " + p.name + " has role matrix but " + std::to_string(p.shape.size()) +
             " dims (Muon needs a 2-D logical shape)");
      if (p.shape[0] % p.qkv_blocks != 0)
        fail("parameter " + p.name + ": qkv_blocks " + std::to_string(p.qkv_blocks) +
             " does not divide rows " + std::to_string(p.shape[0]));
    }
  }
}

namespace {

// Owner placements: pieces carry rank/param_offset/numel; segment offsets are assigned here.
// In each (unit, rank) segment: owned Muon matrices first, then AdamW pieces, inventory order;
// under expert parallelism the expert matrices last (the tail a gather leaves out).
void assign_segment_offsets(ShardPlan& plan) {
  const int N = plan.world_size;
  const bool ep = plan.options.expert_parallel;
  std::vector<int64_t> cursor(plan.units.size() * static_cast<size_t>(N), 0);
  for (int pass = 0; pass < 3; ++pass)
    for (auto& s : plan.shards) {
      const bool expert_tail = ep && s.expert >= 0;
      const int my_pass = expert_tail ? 2 : s.optimizer == OptimizerKind::muon ? 0 : 1;
      if (my_pass != pass) continue;
      for (auto& p : s.pieces) {
        int64_t& c = cursor[static_cast<size_t>(s.unit) * N + p.rank];
        p.segment_offset = c;
        c += p.numel;
      }
    }
  for (size_t u = 0; u < plan.units.size(); ++u)
    for (int r = 0; r < N; ++r) plan.units[u].segment_numel[r] = cursor[u * N + r];
}

void layout_round_robin(ShardPlan& plan) {
  const int N = plan.world_size;
  for (size_t k = 0; k < plan.shards.size(); ++k)
    plan.shards[k].pieces = {ShardPiece{static_cast<int>(k % N), 0, 0, plan.shards[k].numel()}};
  assign_segment_offsets(plan);
}

// Spreads each unit's matrices over ranks without changing any rank's FLOPs or bytes: matrices
// with identical cost (same FLOPs and bytes, e.g. the same layer type in different blocks) may
// trade owners. Each run of equal-cost matrices keeps its multiset of owners (the LPT result):
// 1. deal: in inventory order, each matrix takes, among the ranks with an owner slot of the run
//    left, the one holding the fewest bytes of its unit (the lowest rank on ties); O(run x N);
// 2. trade: pairs are visited in a fixed order, and two matrices swap owners when that lowers sum
//    over (unit, rank) of (unit bytes on rank)^2, until no swap helps, for at most
//    kMaxTradePairs pair visits per run (quadratic: a run of thousands of experts is dealt only).
// Deterministic. `mats` is sorted by (FLOPs, bytes) descending, so equal-cost runs are adjacent.
constexpr int64_t kMaxTradePairs = int64_t{1} << 24;

// Step 2 of spread_units over one run of matrices of `w` bytes each; `at(unit, rank)` is the bytes
// of the unit's matrices on the rank, kept up to date.
template <class At>
void trade_owners(ShardPlan& plan, const std::vector<int>& run, int64_t w, At& at) {
  const int64_t n = static_cast<int64_t>(run.size());
  int64_t budget = kMaxTradePairs;
  for (bool improved = true; improved && budget >= n * (n - 1) / 2;) {
    budget -= n * (n - 1) / 2;
    improved = false;
    for (size_t a = 0; a < run.size(); ++a)
      for (size_t b = a + 1; b < run.size(); ++b) {
        auto& sa = plan.shards[run[a]];
        auto& sb = plan.shards[run[b]];
        const int ra = sa.pieces[0].rank, rb = sb.pieces[0].rank;
        if (ra == rb || sa.unit == sb.unit) continue;
        // Change of the squared sums when a moves ra -> rb and b moves rb -> ra (halved).
        const int64_t delta = (at(sa.unit, rb) - at(sa.unit, ra) + w) + (at(sb.unit, ra) - at(sb.unit, rb) + w);
        if (delta >= 0) continue;
        at(sa.unit, ra) -= w;
        at(sa.unit, rb) += w;
        at(sb.unit, rb) -= w;
        at(sb.unit, ra) += w;
        sa.pieces[0].rank = rb;
        sb.pieces[0].rank = ra;
        improved = true;
      }
  }
}

void spread_units(ShardPlan& plan, const std::vector<int>& mats, const std::vector<double>& flops,
                  const std::vector<int64_t>& bytes) {
  const int N = plan.world_size;
  if (N == 1) return;
  std::vector<int64_t> x(plan.units.size() * static_cast<size_t>(N), 0);  // unit x rank -> bytes
  auto at = [&](int unit, int rank) -> int64_t& { return x[static_cast<size_t>(unit) * N + rank]; };
  for (int i : mats) at(plan.shards[i].unit, plan.shards[i].pieces[0].rank) += bytes[i];
  std::vector<int> slots(N);
  for (size_t lo = 0; lo < mats.size();) {
    size_t hi = lo + 1;
    while (hi < mats.size() && flops[mats[hi]] == flops[mats[lo]] && bytes[mats[hi]] == bytes[mats[lo]]) ++hi;
    std::vector<int> run(mats.begin() + static_cast<std::ptrdiff_t>(lo), mats.begin() + static_cast<std::ptrdiff_t>(hi));
    std::sort(run.begin(), run.end());  // inventory order
    std::fill(slots.begin(), slots.end(), 0);
    for (int i : run) {
      ++slots[plan.shards[i].pieces[0].rank];
      at(plan.shards[i].unit, plan.shards[i].pieces[0].rank) -= bytes[i];
    }
    for (int i : run) {
      const int unit = plan.shards[i].unit;
      int best = -1;
      for (int r = 0; r < N; ++r)
        if (slots[r] > 0 && (best < 0 || at(unit, r) < at(unit, best))) best = r;
      --slots[best];
      at(unit, best) += bytes[i];
      plan.shards[i].pieces[0].rank = best;
    }
    trade_owners(plan, run, bytes[run[0]], at);
    lo = hi;
  }
}

// One LPT item: a Muon matrix, or under expert parallelism the matrices of one expert together.
struct LptItem {
  std::vector<int> shards;
  double flops = 0;
  int64_t bytes = 0;
};

std::vector<LptItem> lpt_items(const ShardPlan& plan, std::vector<double>& flops, std::vector<int64_t>& bytes) {
  std::vector<LptItem> items;
  std::map<int, size_t> item_of_expert;
  for (size_t i = 0; i < plan.shards.size(); ++i) {
    const auto& s = plan.shards[i];
    if (s.optimizer != OptimizerKind::muon) continue;
    flops[i] = shard_muon_flops(s, plan.options);
    bytes[i] = s.numel() * owner_bytes_per_element(OptimizerKind::muon);
    size_t k = items.size();
    if (plan.options.expert_parallel && s.expert >= 0) {
      const auto [it, fresh] = item_of_expert.emplace(s.expert, items.size());
      k = it->second;
      if (fresh) items.emplace_back();
    } else {
      items.emplace_back();
    }
    items[k].shards.push_back(static_cast<int>(i));
    items[k].flops += flops[i];
    items[k].bytes += bytes[i];
  }
  return items;
}

// Longest-processing-time greedy for the matrices (an expert's matrices as one item under expert
// parallelism); returns matrix bytes per rank.
std::vector<int64_t> place_matrices_lpt(ShardPlan& plan) {
  const int N = plan.world_size;
  const size_t U = plan.units.size();
  std::vector<double> flops(plan.shards.size(), 0.0);
  std::vector<int64_t> bytes(plan.shards.size(), 0);
  std::vector<LptItem> items = lpt_items(plan, flops, bytes);
  std::stable_sort(items.begin(), items.end(), [&](const LptItem& a, const LptItem& b) {
    if (a.flops != b.flops) return a.flops > b.flops;
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    return a.shards[0] < b.shards[0];
  });
  std::vector<double> load(N, 0.0);
  std::vector<int64_t> rank_bytes(N, 0), unit_bytes(U * static_cast<size_t>(N), 0);
  std::vector<int> mats;  // single matrices, which spread_units may trade
  for (const LptItem& item : items) {
    const int unit = plan.shards[item.shards[0]].unit;
    const int64_t* ub = &unit_bytes[static_cast<size_t>(unit) * N];
    int best = 0;
    for (int r = 1; r < N; ++r) {
      if (load[r] != load[best]) {
        if (load[r] < load[best]) best = r;
      } else if (rank_bytes[r] != rank_bytes[best]) {
        if (rank_bytes[r] < rank_bytes[best]) best = r;
      } else if (ub[r] < ub[best]) {
        best = r;
      }
    }
    for (int i : item.shards) plan.shards[i].pieces = {ShardPiece{best, 0, 0, plan.shards[i].numel()}};
    load[best] += item.flops;
    rank_bytes[best] += item.bytes;
    unit_bytes[static_cast<size_t>(unit) * N + best] += item.bytes;
    if (item.shards.size() == 1) mats.push_back(item.shards[0]);
  }
  spread_units(plan, mats, flops, bytes);
  return rank_bytes;
}

// Relabels owners across nodes (options.node_of_rank) so that each unit's matrix bytes spread
// over the nodes; `rank_bytes` (matrix bytes per rank) follows the labels. A relabeling moves a
// rank's whole load to another rank, so every per-rank figure keeps its value. Two ranks on
// different nodes swap labels when that lowers sum over (unit, node) of (unit bytes on node)^2;
// pairs are visited in a fixed order until no swap helps (or a pass limit): deterministic.
void spread_owners_over_nodes(ShardPlan& plan, std::vector<int64_t>& rank_bytes) {
  const std::vector<int>& node = plan.options.node_of_rank;
  const int N = plan.world_size;
  if (node.empty() || std::all_of(node.begin(), node.end(), [&](int n) { return n == node[0]; })) return;
  const size_t U = plan.units.size();
  std::vector<double> x(U * static_cast<size_t>(N), 0.0);  // unit x rank -> matrix bytes
  auto at = [&](size_t u, int r) -> double& { return x[u * N + r]; };
  for (const MatrixShard& s : plan.shards)
    if (s.optimizer == OptimizerKind::muon)
      at(static_cast<size_t>(s.unit), s.pieces[0].rank) += static_cast<double>(s.numel());
  const int nodes = *std::max_element(node.begin(), node.end()) + 1;
  std::vector<double> on_node(U * static_cast<size_t>(nodes), 0.0);
  for (size_t u = 0; u < U; ++u)
    for (int r = 0; r < N; ++r) on_node[u * nodes + node[r]] += at(u, r);
  std::vector<int> label(N);  // current label -> the rank whose load it carries
  for (int r = 0; r < N; ++r) label[r] = r;
  for (int pass = 0; pass < 32; ++pass) {
    bool improved = false;
    for (int a = 0; a < N; ++a)
      for (int b = a + 1; b < N; ++b) {
        if (node[a] == node[b]) continue;
        double delta = 0;  // a's and b's loads trade nodes: d moves from node[a] to node[b]
        for (size_t u = 0; u < U; ++u) {
          const double d = at(u, a) - at(u, b);
          delta += 2.0 * d * (on_node[u * nodes + node[b]] - on_node[u * nodes + node[a]] + d);
        }
        if (delta >= -1e-9) continue;
        for (size_t u = 0; u < U; ++u) {
          const double d = at(u, a) - at(u, b);
          on_node[u * nodes + node[a]] -= d;
          on_node[u * nodes + node[b]] += d;
          std::swap(at(u, a), at(u, b));
        }
        std::swap(label[a], label[b]);
        improved = true;
      }
    if (!improved) break;
  }
  std::vector<int> new_rank(N);
  for (int r = 0; r < N; ++r) new_rank[label[r]] = r;
  std::vector<int64_t> moved(N);
  for (int r = 0; r < N; ++r) moved[new_rank[r]] = rank_bytes[r];
  rank_bytes = std::move(moved);
  for (MatrixShard& s : plan.shards)
    if (s.optimizer == OptimizerKind::muon) s.pieces[0].rank = new_rank[s.pieces[0].rank];
}

// Water-fills the AdamW tail into the ranks with the fewest bytes (see make_plan's comment).
void place_tail(ShardPlan& plan, const std::vector<int64_t>& matrix_bytes) {
  const int N = plan.world_size;
  std::vector<int> tail;
  for (size_t i = 0; i < plan.shards.size(); ++i)
    if (plan.shards[i].optimizer == OptimizerKind::adamw) tail.push_back(static_cast<int>(i));
  std::stable_sort(tail.begin(), tail.end(),
                   [&](int a, int b) { return plan.shards[a].unit < plan.shards[b].unit; });
  std::vector<int64_t> start(tail.size() + 1, 0);  // stream position of each tail tensor
  for (size_t k = 0; k < tail.size(); ++k) start[k + 1] = start[k] + plan.shards[tail[k]].numel();
  const int64_t T = start.back();
  if (T == 0) return;

  // Level L with sum_r max(0, L - B_r) = T * b, b = AdamW bytes per element.
  const double b = static_cast<double>(owner_bytes_per_element(OptimizerKind::adamw));
  std::vector<int> order(N);
  for (int r = 0; r < N; ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return matrix_bytes[x] < matrix_bytes[y]; });
  double acc = 0.0, level = 0.0;
  for (int k = 1; k <= N; ++k) {
    acc += static_cast<double>(matrix_bytes[order[k - 1]]);
    level = (static_cast<double>(T) * b + acc) / k;
    if (k == N || level <= static_cast<double>(matrix_bytes[order[k]])) break;
  }
  // Rank r takes stream range [bound[r-1], bound[r]); bounds are rounded cumulative capacities.
  std::vector<int64_t> bound(N, T);
  double cum = 0.0;
  for (int r = 0; r + 1 < N; ++r) {
    cum += std::max(0.0, level - static_cast<double>(matrix_bytes[r])) / b;
    bound[r] = std::min<int64_t>(T, std::llround(cum));
  }
  // Move cuts that fall inside small tensors (< 1/64 of an even share) to the nearer edge.
  const int64_t snap_limit = T / (64 * static_cast<int64_t>(N));
  int64_t prev = 0;
  for (int r = 0; r + 1 < N; ++r) {
    int64_t c = bound[r];
    const size_t k = std::upper_bound(start.begin(), start.end(), c) - start.begin() - 1;
    if (k < tail.size() && c > start[k] && c < start[k + 1] &&
        start[k + 1] - start[k] <= snap_limit)
      c = (c - start[k] <= start[k + 1] - c) ? start[k] : start[k + 1];
    bound[r] = prev = std::max(prev, c);
  }
  // Cut every tail tensor along the rank ranges.
  for (size_t k = 0; k < tail.size(); ++k) {
    auto& s = plan.shards[tail[k]];
    s.pieces.clear();
    const int64_t lo = start[k], hi = start[k + 1];
    int r = static_cast<int>(std::upper_bound(bound.begin(), bound.end(), lo) - bound.begin());
    for (; r < N; ++r) {
      const int64_t rlo = r == 0 ? 0 : bound[r - 1], rhi = bound[r];
      if (rlo >= hi) break;
      const int64_t a = std::max(lo, rlo), e = std::min(hi, rhi);
      if (e > a) s.pieces.push_back(ShardPiece{r, 0, a - lo, e - a});
    }
  }
}

void layout_fsdp2(ShardPlan& plan) {
  const int N = plan.world_size;
  std::vector<int64_t> cursor(plan.units.size(), 0);  // slot offset, equal on every rank
  for (auto& s : plan.shards) {
    const int64_t rpr = s.fsdp2_rows_per_rank(N), cols = s.row_numel();
    s.pieces.clear();
    for (int r = 0; r < N; ++r) {
      const int64_t rows_on = s.fsdp2_rows_on(r, N);
      if (rows_on == 0) break;  // later ranks hold no rows either
      s.pieces.push_back(ShardPiece{r, cursor[s.unit], r * rpr * cols, rows_on * cols});
    }
    cursor[s.unit] += rpr * cols;
  }
  for (size_t u = 0; u < plan.units.size(); ++u)
    std::fill(plan.units[u].segment_numel.begin(), plan.units[u].segment_numel.end(), cursor[u]);
}

void layout_ddp(ShardPlan& plan) {
  for (auto& s : plan.shards) {
    s.pieces = {ShardPiece{0, plan.units[s.unit].segment_numel[0], 0, s.numel()}};
    plan.units[s.unit].segment_numel[0] += s.numel();
  }
}

}  // namespace

ShardPlan make_plan(const ParamInventory& inv, int world_size, Placement placement,
                    const PlannerOptions& options) {
  if (world_size < 1 || world_size > kMaxPlanWorldSize)
    throw std::invalid_argument("[make_plan] world size " + std::to_string(world_size) +
                                " not in [1, " + std::to_string(kMaxPlanWorldSize) + "]");
  if (options.ns_steps < 0)
    throw std::invalid_argument("[make_plan] ns_steps " + std::to_string(options.ns_steps) +
                                " < 0");
  if (options.head_dim < 0)
    throw std::invalid_argument("[make_plan] head_dim " + std::to_string(options.head_dim) + " < 0");
  const std::vector<int>& node = options.node_of_rank;
  if (!node.empty() && (static_cast<int>(node.size()) != world_size ||
                        std::any_of(node.begin(), node.end(), [&](int n) { return n < 0 || n >= world_size; })))
    throw std::invalid_argument("[make_plan] node_of_rank: expected " + std::to_string(world_size) +
                                " node numbers in [0, world size), got " + std::to_string(node.size()));
  if (options.expert_parallel && (placement != Placement::matrixfsdp || options.round_robin))
    throw std::invalid_argument(std::string("[make_plan] expert_parallel needs placement matrixfsdp with LPT owners, got ") +
                                placement_name(placement) + (options.round_robin ? " (round-robin)" : ""));
  validate_inventory(inv);
  ShardPlan plan;
  plan.world_size = world_size;
  plan.placement = placement;
  plan.options = options;
  for (const auto& name : inv.unit_names)
    plan.units.push_back(UnitLayout{name, std::vector<int64_t>(world_size, 0), {}});
  for (const auto& p : inv.params) {
    MatrixShard s;
    s.name = p.name;
    s.shape = p.shape;
    s.role = p.role;
    s.unit = p.unit;
    s.qkv_blocks = p.qkv_blocks;
    s.expert = p.expert;
    s.optimizer = p.role == ParamRole::matrix ? OptimizerKind::muon : OptimizerKind::adamw;
    plan.shards.push_back(std::move(s));
  }
  switch (placement) {
    case Placement::fsdp2: layout_fsdp2(plan); break;
    case Placement::ddp: layout_ddp(plan); break;
    case Placement::matrixfsdp:
    case Placement::zero1:
      if (options.round_robin) {
        layout_round_robin(plan);
      } else {
        std::vector<int64_t> matrix_bytes = place_matrices_lpt(plan);
        spread_owners_over_nodes(plan, matrix_bytes);
        place_tail(plan, matrix_bytes);
        assign_segment_offsets(plan);
      }
      break;
  }
  for (auto& s : plan.shards)
    s.owner = (placement != Placement::ddp && s.pieces.size() == 1) ? s.pieces[0].rank : -1;
  plan.set_gathered_numel();
  plan.stats = compute_stats(plan);
  return plan;
}

std::string routing_summary(const ShardPlan& plan) {
  const auto& st = plan.stats;
  return "muon: " + std::to_string(st.muon_params) + " tensors, " + std::to_string(st.muon_numel) +
         " elements; adamw: " + std::to_string(st.adamw_params) + " tensors, " +
         std::to_string(st.adamw_numel) + " elements";
}

}  // namespace mfsdp
