#include "planner/memory_plan.h"
#include "runtime/engine/owner_state.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>

#include "optim/clip.h"
#include "optim/step.h"
#include "runtime/kernels.h"
#include "runtime/trace/trace.h"

namespace mfsdp {
namespace {

// The args of a Newton-Schulz span: the matrix (when one), how many matrices and each one's shape.
std::string ns_args(const std::string& matrix, int64_t matrices, int64_t rows, int64_t cols) {
  return (matrix.empty() ? std::string() : "\"matrix\":" + trace::json_string(matrix) + ",") +
         "\"matrices\":" + std::to_string(matrices) + ",\"shape\":[" + std::to_string(rows) + "," +
         std::to_string(cols) + "]";
}

}  // namespace

ExactSum all_reduce_exact(Communicator& comm, const ExactSum& local, CommPhase phase) {
  const auto words = local.to_words();
  std::vector<std::array<int64_t, ExactSum::kWords>> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather_host(words.data(), all.data(), sizeof(words), phase);
  ExactSum total;
  for (const auto& w : all) total.merge(ExactSum::from_words(w));
  return total;
}

OwnerState::OwnerState(UnitBuffers& units, Communicator& comm, const ShardPlan& plan, const PlacementTraits& traits,
                       const EngineOptions& opts)
    : units_(units), comm_(comm), plan_(plan), traits_(traits), opts_(opts) {
  const int rank = comm.rank();
  for (int u = 0; u < units.size(); ++u)
    for (int si : plan_.shards_in_unit(u)) {
      const MatrixShard& s = plan_.shards[si];
      if (traits_.every_rank_updates_all) {
        for (const ShardPiece& p : s.pieces)
          pieces_.push_back({u, si, p.segment_offset, p.param_offset, p.numel, {}, {}, {}});
      } else if (const ShardPiece* p = s.piece_on(rank)) {
        pieces_.push_back({u, si, p->segment_offset, p->param_offset, p->numel, {}, {}, {}});
      } else if (traits_.gathered_muon_input && s.optimizer == OptimizerKind::muon) {
        pieces_.push_back({u, si, 0, 0, 0, {}, {}, {}});  // joins the step's all-gather of the Muon input
      }
    }
  MemCategoryScope scope(MemCategory::optimizer_state);
  const bool normuon = opts_.muon.variant == MuonVariant::normuon;
  for (OwnedPiece& o : pieces_) {
    const MatrixShard& s = plan_.shards[o.shard];
    o.m = Tensor::zeros({o.numel}, DType::f32, units_.device());
    if (s.optimizer == OptimizerKind::adamw) o.v = Tensor::zeros({o.numel}, DType::f32, units_.device());
    else if (normuon) o.v = Tensor::zeros({s.shape[0]}, DType::f32, units_.device());
  }
}

bool OwnerState::has_row_state(const OwnedPiece& o) const {
  return o.v.defined() && plan_.shards[o.shard].optimizer == OptimizerKind::muon;
}

std::pair<int64_t, int64_t> OwnerState::piece_rows(const OwnedPiece& o) const {
  const int64_t cols = plan_.shards[o.shard].shape[1];
  return {o.param_offset / cols, o.numel / cols};
}

void OwnerState::for_each_row_state(const std::function<void(OwnedPiece&)>& fn) {
  for (OwnedPiece& o : pieces_)
    if (has_row_state(o)) fn(o);
}

Tensor OwnerState::param(const OwnedPiece& o) { return units_.unit(o.unit).shard.view(o.shard_offset, {o.numel}); }
Tensor OwnerState::grad(const OwnedPiece& o) { return units_.unit(o.unit).shard_grad.view(o.shard_offset, {o.numel}); }

void OwnerState::for_each_owned(const std::function<void(OwnedPiece&)>& fn) {
  for (OwnedPiece& o : pieces_)
    if (o.numel > 0) fn(o);
}

void OwnerState::reset() {
  for (OwnedPiece& o : pieces_) {
    o.m.zero();
    if (o.v.defined()) o.v.zero();
  }
  steps_ = 0;
}

void OwnerState::clip_gradients(StepStats& st) {
  // The exact sum of squares makes the norm, and so the clip coefficient, the same bits at every
  // world size and placement, however the tail tensors are split.
  // All owned gradient shards in one call: on CUDA one launch and one device->host copy.
  ExactSum sumsq;
  std::vector<Tensor> shards;
  for (int u = 0; u < units_.size(); ++u) shards.push_back(units_.unit(u).shard_grad);
  add_sum_of_squares(shards, sumsq);
  // every rank updating everything holds all gradients; otherwise each rank holds its owned shards
  if (!traits_.every_rank_updates_all) sumsq = all_reduce_exact(comm_, sumsq, CommPhase::other);
  st.grad_norm = std::sqrt(sumsq.value());
  if (!std::isfinite(st.grad_norm)) throw_non_finite(st);
  st.clip_coef = clip_coefficient(st.grad_norm, opts_.grad_clip);
  if (st.clip_coef < 1.0) units_.scale_gradients(static_cast<float>(st.clip_coef));
}

// Every rank sees the same norm, so all take this path together: name the first tensor (in plan
// order) whose gradient holds a NaN/Inf on any rank, then stop before the optimizer step.
void OwnerState::throw_non_finite(const StepStats& st) {
  int first = static_cast<int>(plan_.shards.size());
  for_each_owned([&](OwnedPiece& o) {
    if (o.shard >= first) return;
    for (float g : grad(o).to_vector())
      if (!std::isfinite(g)) {
        first = o.shard;
        break;
      }
  });
  first = static_cast<int>(-comm_.all_reduce_scalar(-static_cast<double>(first), ReduceOp::max, CommPhase::other));
  throw NonFiniteLossError("step " + std::to_string(st.step) + ": the global gradient norm is " +
                           std::to_string(st.grad_norm) + " (first non-finite gradient: " +
                           (first < static_cast<int>(plan_.shards.size()) ? plan_.shards[first].name : "?") +
                           "); the optimizer step was skipped");
}

void OwnerState::optimizer_step(int64_t step, StepStats& st, const std::vector<RowScale>& qk_clip) {
  const double mult = opts_.schedule.multiplier(step);
  st.lr_muon = opts_.muon.lr * mult;
  st.lr_adamw = opts_.adamw.lr * mult;
  ++steps_;
  const bool batched = opts_.batch_orthogonalize == Toggle::on;  // resolve() left no Toggle automatic
  std::vector<char> stepped(pieces_.size(), 0);  // Muon pieces the batched chunks updated already
  if (batched && !traits_.gathered_muon_input) stepped = orthogonalize_batched(st.lr_muon);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    OwnedPiece& o = pieces_[i];
    const MatrixShard& s = plan_.shards[o.shard];
    if (s.optimizer == OptimizerKind::muon) {
      if (!stepped[i]) muon_piece(o, st.lr_muon);
    } else if (o.numel) {
      AdamWOptions a = opts_.adamw;
      if (s.shape.size() < 2) a.weight_decay = 0.0;  // norms and biases are not decayed
      adamw_step(param(o), grad(o), o.m, o.v, st.lr_adamw, steps_, a);
    }
  }
  scale_rows(qk_clip);
  if (traits_.gather_after_step) units_.all_gather_updated_params();
}

void OwnerState::orthogonalize_unit(int u) {
  for (OwnedPiece& o : pieces_)
    if (o.unit == u && plan_.shards[o.shard].optimizer == OptimizerKind::muon) o.update = orthogonalized(o, false);
}

// Stock FSDP2 + Muon (gathered input): momentum on the local rows, all-gather the Muon input, the
// orthogonalizer on the full matrix on every rank. Otherwise the owner's whole matrix.
Tensor OwnerState::orthogonalized(OwnedPiece& o, bool commit) {
  const MatrixShard& s = plan_.shards[o.shard];
  const int64_t rows = s.shape[0], cols = s.shape[1];
  const int64_t blocks = detail::muon_block_count(rows, cols, opts_.muon, s.qkv_blocks, "OwnerState");
  const Device dev = units_.device();
  ++orthogonalizations_;
  // The momentum goes into o.m (commit) or into a copy of it: the same f32 operations either way.
  auto momentum = [&](const Tensor& U) {
    muon_momentum(grad(o), commit ? o.m : o.m.clone(), U, opts_.muon);
  };
  if (!traits_.gathered_muon_input) {
    MemCategoryScope scope(MemCategory::other);
    Tensor U = Tensor::empty({o.numel}, DType::f32, dev);
    momentum(U);
    trace::Span span(trace::Lane::schedule, "newton_schulz", s.name.c_str(), [&] { return ns_args(s.name, 1, rows, cols); });
    muon_orthogonalize(U, U, rows, cols, blocks, opts_.muon);
    return U;
  }
  const int64_t slot = s.fsdp2_slot_numel(comm_.world_size());
  MemCategoryScope scope(MemCategory::comm_buffers);
  Tensor send = Tensor::zeros({slot}, DType::f32, dev), full_u = Tensor::empty({slot * comm_.world_size()}, DType::f32, dev);
  if (o.numel) momentum(send.view(0, {o.numel}));
  comm_.all_gather(send.data_f32(), full_u.data_f32(), slot, DType::f32, CommPhase::opt_step);
  // the first `rows` rows of the gathered slots are the matrix, in order (padding rows follow)
  Tensor update = Tensor::empty({rows * cols}, DType::f32, dev);
  trace::Span span(trace::Lane::schedule, "newton_schulz", s.name.c_str(), [&] { return ns_args(s.name, 1, rows, cols); });
  muon_orthogonalize(full_u.view(0, {rows * cols}), update, rows, cols, blocks, opts_.muon);
  return update;
}

std::vector<char> OwnerState::orthogonalize_batched(double lr) {
  std::vector<char> stepped(pieces_.size(), 0);
  std::map<std::array<int64_t, 3>, std::vector<OwnedPiece*>> groups;  // (rows, cols, blocks) -> pieces
  for (OwnedPiece& o : pieces_) {
    const MatrixShard& s = plan_.shards[o.shard];
    if (s.optimizer != OptimizerKind::muon || o.update.defined() || o.numel == 0 || o.numel != s.numel()) continue;
    const int64_t blocks = detail::muon_block_count(s.shape[0], s.shape[1], opts_.muon, s.qkv_blocks, "OwnerState");
    groups[{s.shape[0], s.shape[1], blocks}].push_back(&o);
  }
  MemCategoryScope scope(MemCategory::other);
  for (const auto& [shape, group] : groups) {
    const auto [rows, cols, blocks] = shape;
    const int64_t numel = rows * cols;
    const size_t per_chunk = static_cast<size_t>(std::max<int64_t>(1, kNewtonSchulzBatchBytes / (4 * numel)));
    for (size_t first = 0; first < group.size(); first += per_chunk) {
      const int64_t n = static_cast<int64_t>(std::min(per_chunk, group.size() - first));
      if (n < 2) break;  // a lone matrix takes the one-matrix path
      Tensor U = Tensor::empty({n * numel}, DType::f32, units_.device());
      for (int64_t i = 0; i < n; ++i) {
        OwnedPiece& o = *group[first + static_cast<size_t>(i)];
        muon_momentum(grad(o), o.m.clone(), U.view(i * numel, {numel}), opts_.muon);  // committed by muon_piece
      }
      trace::Span span(trace::Lane::schedule, "newton_schulz", "batch", [&] {
        std::string names;
        for (int64_t i = 0; i < n; ++i)
          names.append(i ? "," : "").append(trace::json_string(plan_.shards[group[first + static_cast<size_t>(i)]->shard].name));
        return ns_args("", n, rows, cols) + ",\"names\":[" + names + "]";
      });
      muon_orthogonalize(U, U, n * rows, cols, n * blocks, opts_.muon);
      orthogonalizations_ += n;
      for (int64_t i = 0; i < n; ++i) {  // applied now, so one chunk's updates are alive at a time
        OwnedPiece& o = *group[first + static_cast<size_t>(i)];
        o.update = U.view(i * numel, {numel});
        muon_piece(o, lr);
        stepped[static_cast<size_t>(&o - pieces_.data())] = 1;
      }
    }
  }
  return stepped;
}

// One Muon-family step of piece o: the orthogonalized update (made now, or during backward under
// overlap_backward), NorMuon's normalization of the whole matrix, then the apply on o's elements.
void OwnerState::muon_piece(OwnedPiece& o, double lr) {
  const MatrixShard& s = plan_.shards[o.shard];
  const int64_t rows = s.shape[0], cols = s.shape[1];
  const bool normuon = opts_.muon.variant == MuonVariant::normuon;
  if (!traits_.gathered_muon_input && !normuon && !o.update.defined()) {  // one fused call
    if (o.numel) {
      trace::Span span(trace::Lane::schedule, "newton_schulz", s.name.c_str(),  // momentum, NS and update in one
                       [&] { return ns_args(s.name, 1, rows, cols) + ",\"with_update\":true"; });
      muon_step(param(o), grad(o), o.m, rows, cols, lr, opts_.muon, s.qkv_blocks);
      ++orthogonalizations_;
    }
    return;
  }
  Tensor update = std::move(o.update);
  o.update = Tensor();
  if (update.defined()) {
    // the momentum the backward-time copy computed, now into the state (U may alias G: the
    // gradient is not read again this step)
    if (o.numel) muon_momentum(grad(o), o.m, grad(o), opts_.muon);
  } else {
    update = orthogonalized(o, true);
  }
  const int64_t blocks = detail::muon_block_count(rows, cols, opts_.muon, s.qkv_blocks, "OwnerState");
  double scale = muon_scale(rows / blocks, cols, opts_.muon.scale_rule);
  if (normuon) {  // every fsdp2 rank normalizes the whole gathered matrix with its whole v
    normuon_normalize(update, o.v, rows, cols, blocks, opts_.muon);
    scale = 1.0;
  }
  if (o.numel) muon_apply(param(o), update.view(o.param_offset, {o.numel}), lr, scale, opts_.muon.weight_decay);
}

void OwnerState::scale_rows(const std::vector<RowScale>& scales) {
  for (const RowScale& r : scales)
    for (OwnedPiece& o : pieces_) {
      if (o.shard != r.shard || o.numel == 0) continue;
      const MatrixShard& s = plan_.shards[o.shard];
      const int64_t width = s.shape.size() > 1 ? s.numel() / s.shape[0] : 1;
      const int64_t lo = std::max(r.first_row * width, o.param_offset);
      const int64_t hi = std::min((r.first_row + r.rows) * width, o.param_offset + o.numel);
      if (lo < hi) kernels(units_.device()).scale(param(o).data_f32() + (lo - o.param_offset), r.factor, hi - lo);
    }
}

}  // namespace mfsdp
