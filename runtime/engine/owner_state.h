// What a rank owns between steps: the pieces of parameters it updates, their optimizer state, and
// the owner-side half of a step (global gradient norm, clipping, the optimizer step).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "optim/exact_sum.h"
#include "planner/shard_plan.h"
#include "runtime/engine/engine_options.h"
#include "runtime/engine/unit_buffers.h"

namespace mfsdp {

/// A piece of a parameter this rank updates, with its optimizer state (on the engine's device).
struct OwnedPiece {
  int unit = 0;
  int shard = 0;
  int64_t shard_offset = 0;  ///< element offset in the unit's shard / shard_grad
  int64_t param_offset = 0;  ///< element offset in the logical parameter
  int64_t numel = 0;         ///< 0 for an fsdp2 matrix this rank holds no rows of (it joins the gather)
  /// m: Muon momentum | AdamW first moment (numel). v: AdamW second moment (numel) | NorMuon's
  /// per-row second moment of the whole matrix (rows; every fsdp2 rank keeps all rows, since each
  /// normalizes the gathered matrix) | undefined (variant muon).
  Tensor m, v;
  /// overlap_backward: the orthogonalized update of the whole matrix made during backward, consumed
  /// (and freed) by the optimizer step; undefined otherwise.
  Tensor update;
};

/// Rows [first_row, first_row + rows) of a parameter's dim 0 (1-D: elements) multiplied by factor.
struct RowScale {
  int shard = 0;
  int64_t first_row = 0, rows = 0;
  float factor = 1.0f;
};

/// The owned pieces of one rank and the optimizer step over them.
class OwnerState {
 public:
  /// Lists this rank's pieces from the plan (every piece under every_rank_updates_all) and
  /// allocates zeroed optimizer state for them. `opts` are resolved (resolve(): no Toggle automatic).
  OwnerState(UnitBuffers& units, Communicator& comm, const ShardPlan& plan, const PlacementTraits& traits,
             const EngineOptions& opts);

  /// Views of a piece's parameter values and gradient in its unit's segment.
  Tensor param(const OwnedPiece& o);
  Tensor grad(const OwnedPiece& o);

  /// Calls fn for every owned piece with numel > 0, in canonical order (unit, then parameter).
  void for_each_owned(const std::function<void(OwnedPiece&)>& fn);
  /// Calls fn for every piece holding NorMuon per-row state (variant normuon), including fsdp2
  /// pieces with numel == 0, in canonical order.
  void for_each_row_state(const std::function<void(OwnedPiece&)>& fn);
  /// True when o.v is NorMuon per-row state (whole-matrix rows) rather than AdamW's v.
  bool has_row_state(const OwnedPiece& o) const;
  /// The matrix rows o's elements cover: {first row, row count} (Muon pieces are whole rows).
  std::pair<int64_t, int64_t> piece_rows(const OwnedPiece& o) const;
  /// Zeroes every moment and the step counter.
  void reset();
  int64_t steps() const { return steps_; }
  /// Muon-family orthogonalizations (Newton-Schulz or the configured orthogonalizer, one per
  /// matrix) this rank has run since construction: its owned Muon matrices per step (every Muon
  /// matrix under a gathered Muon input).
  int64_t orthogonalizations() const { return orthogonalizations_; }
  void set_steps(int64_t n) { steps_ = n; }

  /// The global L2 norm of the gradients (exact: the same bits at any world size and placement),
  /// then clips the gradient shards by clip_coefficient(norm, grad_clip); fills stats.grad_norm
  /// and stats.clip_coef. Throws NonFiniteLossError on every rank when the norm is not finite.
  void clip_gradients(StepStats& stats);
  /// overlap_backward: makes the orthogonalized update (OwnedPiece::update) of every Muon matrix
  /// of unit u this rank takes part in, from its final (already scaled) gradient, without touching
  /// optimizer state. Under fsdp2 it all-gathers the Muon input (opt_step phase), so every rank
  /// calls it for the same units in the same order.
  void orthogonalize_unit(int u);
  /// One optimizer step on every owned piece at 0-based step `step` (LR schedule); then the
  /// row scalings `qk_clip` (QK-Clip) on the owned parts of those rows; then the placement's
  /// post-step gather. Fills stats.lr_muon and stats.lr_adamw.
  void optimizer_step(int64_t step, StepStats& stats, const std::vector<RowScale>& qk_clip = {});

 private:
  [[noreturn]] void throw_non_finite(const StepStats& stats);
  /// The orthogonalized update of o's whole matrix (every rank under fsdp2): momentum of o's rows
  /// (into o.m when commit, else into a copy), the fsdp2 all-gather, then the orthogonalizer.
  Tensor orthogonalized(OwnedPiece& o, bool commit);
  /// Batched orthogonalization: the updates of the whole Muon matrices this rank owns, grouped by
  /// shape (and block split), each group's Muon inputs laid out as the row blocks of one tall
  /// matrix so that CUDA runs one strided-batched Newton-Schulz chain per group (chunks of at
  /// most kNewtonSchulzBatchBytes, planner/memory_plan.h), and steps each chunk's pieces with
  /// learning rate `lr` as soon as the chunk is orthogonalized, so one chunk's updates are alive
  /// at a time; the same arithmetic per matrix as the one-matrix path. Returns, per piece of
  /// pieces_, whether it was stepped.
  std::vector<char> orthogonalize_batched(double lr);
  void muon_piece(OwnedPiece& o, double lr);
  void scale_rows(const std::vector<RowScale>& scales);

  UnitBuffers& units_;
  Communicator& comm_;
  const ShardPlan& plan_;
  PlacementTraits traits_;
  const EngineOptions& opts_;
  std::vector<OwnedPiece> pieces_;
  int64_t steps_ = 0;
  int64_t orthogonalizations_ = 0;
};

/// Exact sum over ranks: every rank's accumulator is gathered and merged with integer additions,
/// so all ranks get the same bits whatever the rank split (one all_gather_host).
ExactSum all_reduce_exact(Communicator& comm, const ExactSum& local, CommPhase phase);

}  // namespace mfsdp
