#include "planner/memory_plan.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "planner/cost_model.h"
#include "planner/placement_traits.h"
#include "runtime/core/classifier_memory.h"

namespace mfsdp {
namespace {

double bytes_of(DType d) { return d == DType::bf16 ? 2.0 : 4.0; }

// Elements of the largest run of `n` consecutive units, or of the first and last unit together
// (a head tied to the embedding runs with unit 0 gathered).
double largest_window(const ShardPlan& plan, int n) {
  const auto& U = plan.units;
  double best = static_cast<double>(U.front().total_numel() + (U.size() > 1 ? U.back().total_numel() : 0));
  for (size_t u = 0; u < U.size(); ++u) {
    double w = 0;
    for (size_t k = u; k < std::min(U.size(), u + static_cast<size_t>(n)); ++k) w += static_cast<double>(U[k].total_numel());
    best = std::max(best, w);
  }
  return best;
}

// Newton-Schulz on `count` m x n matrices at once (m <= n after the transpose): their Muon inputs,
// which become the updates (m x n each), and one orthogonalization's scratch at a time: two
// iterates (m x n) and A = X X^T and B (m x m).
double newton_schulz_bytes(const MatrixShard& s, double count = 1) {
  const double m = static_cast<double>(std::min(s.shape[0], s.shape[1]));
  const double n = static_cast<double>(std::max(s.shape[0], s.shape[1]));
  return 4.0 * (count * m * n + 2.0 * m * n + 2.0 * m * m);
}

// The batched chains of a rank's owned matrices: the largest chain's workspace, each chain at most
// kNewtonSchulzBatchBytes of inputs (and at least one matrix).
double batched_newton_schulz_bytes(const std::vector<const MatrixShard*>& owned) {
  std::map<std::pair<int64_t, int64_t>, std::pair<const MatrixShard*, int64_t>> shapes;  // shape -> (one of them, count)
  for (const MatrixShard* s : owned) {
    auto& [any, count] = shapes[{s->shape[0], s->shape[1]}];
    any = s;
    ++count;
  }
  double worst = 0;
  for (const auto& [shape, group] : shapes) {
    const int64_t per_chain = std::max<int64_t>(1, kNewtonSchulzBatchBytes / (4 * group.first->numel()));
    worst = std::max(worst, newton_schulz_bytes(*group.first, static_cast<double>(std::min(group.second, per_chain))));
  }
  return worst;
}

}  // namespace

std::vector<std::pair<std::string, double>> MemoryPlan::terms() const {
  std::vector<std::pair<std::string, double>> t = {
      {"parameters", parameters},         {"gradients", gradients},   {"optimizer_state", optimizer_state},
      {"gathered_params", gathered_params}, {"gathered_grads", gathered_grads}, {"newton_schulz", newton_schulz},
      {"activations", activations},       {"classifier", classifier}};
  return t;
}

double activation_bytes_per_token_layer(const MemoryModel& model, int context) {
  return 2.0 * (34.0 * model.n_embd + 5.0 * model.n_head * static_cast<double>(context));
}

MemoryPlan plan_memory(const ShardPlan& plan, const MemoryModel& model, const MemoryPlanOptions& opts, int rank) {
  if (rank < 0 || rank >= plan.world_size)
    throw std::invalid_argument("plan_memory: rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(plan.world_size) + ")");
  const PlacementTraits traits = placement_traits(plan.placement);
  MemoryPlan m;
  double stored = 0;
  for (const UnitLayout& u : plan.units)
    stored += static_cast<double>(traits.resident ? u.total_numel() : u.segment_numel[static_cast<size_t>(rank)]);
  m.parameters = 4.0 * stored;
  m.gradients = 4.0 * stored;
  if (traits.resident && !traits.every_rank_updates_all)  // zero1: the owner's reduced segment besides the full gradients
    for (const UnitLayout& u : plan.units) m.gradients += 4.0 * static_cast<double>(u.segment_numel[static_cast<size_t>(rank)]);
  double largest_matrix = 0;
  std::vector<const MatrixShard*> owned_whole;  // the Muon matrices this rank owns whole (batched chains)
  for (const MatrixShard& s : plan.shards) {
    const double state = 4.0 * static_cast<double>(state_per_element(s.optimizer));
    const bool muon = s.optimizer == OptimizerKind::muon;
    if (traits.every_rank_updates_all) {
      m.optimizer_state += state * static_cast<double>(s.numel());
      if (muon) largest_matrix = std::max(largest_matrix, newton_schulz_bytes(s));
      continue;
    }
    for (const ShardPiece& p : s.pieces)
      if (p.rank == rank) {
        m.optimizer_state += state * static_cast<double>(p.numel);
        if (muon && !traits.gathered_muon_input) largest_matrix = std::max(largest_matrix, newton_schulz_bytes(s));
        if (muon && !traits.gathered_muon_input && p.numel == s.numel()) owned_whole.push_back(&s);
      }
    if (muon && traits.gathered_muon_input)  // every rank gathers each Muon input and orthogonalises it
      largest_matrix = std::max(largest_matrix, newton_schulz_bytes(s) + 8.0 * static_cast<double>(s.numel()));
  }
  m.newton_schulz = opts.batch_orthogonalize ? std::max(largest_matrix, batched_newton_schulz_bytes(owned_whole))
                                             : largest_matrix;
  const double largest_unit = [&] {
    double x = 0;
    for (const UnitLayout& u : plan.units) x = std::max(x, static_cast<double>(u.total_numel()));
    return x;
  }();
  if (!traits.resident) {
    const double per_element = 4.0 + (opts.param_dtype == DType::bf16 ? 2.0 : 0.0);
    m.gathered_params = per_element * largest_window(plan, opts.prefetch_depth + 1);
    m.gathered_grads = 4.0 * largest_unit * (opts.overlap_reduce ? 2.0 : 1.0);
  }
  const double e = bytes_of(opts.compute_dtype);
  const double tokens = static_cast<double>(opts.micro_batch) * opts.seq;
  const double layer = activation_bytes_per_token_layer(model, opts.seq) * e / 4.0 * tokens;
  m.activations = opts.recompute ? model.n_layer * tokens * model.n_embd * e + layer : model.n_layer * layer;
  m.classifier = classifier_bytes(tokens, static_cast<double>(model.padded_vocab), model.n_embd, e == 2.0);
  return m;
}

MemoryPlan plan_memory_worst(const ShardPlan& plan, const MemoryModel& model, const MemoryPlanOptions& opts,
                             int* rank_out) {
  MemoryPlan worst;
  int at = 0;
  for (int r = 0; r < plan.world_size; ++r) {
    MemoryPlan m = plan_memory(plan, model, opts, r);
    if (r == 0 || m.total() > worst.total()) {
      worst = m;
      at = r;
    }
  }
  if (rank_out) *rank_out = at;
  return worst;
}

}  // namespace mfsdp
