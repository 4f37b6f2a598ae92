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
  Tensor m, v;               ///< Muon momentum | AdamW first and second moments
};

/// The owned pieces of one rank and the optimizer step over them.
class OwnerState {
 public:
  /// Lists this rank's pieces from the plan (every piece under every_rank_updates_all) and
  /// allocates zeroed optimizer state for them.
  OwnerState(UnitBuffers& units, Communicator& comm, const ShardPlan& plan, const PlacementTraits& traits,
             const EngineOptions& opts);

  /// Views of a piece's parameter values and gradient in its unit's segment.
  Tensor param(const OwnedPiece& o);
  Tensor grad(const OwnedPiece& o);

  /// Calls fn for every owned piece with numel > 0, in canonical order (unit, then parameter).
  void for_each_owned(const std::function<void(OwnedPiece&)>& fn);
  /// Zeroes every moment and the step counter.
  void reset();
  int64_t steps() const { return steps_; }
  void set_steps(int64_t n) { steps_ = n; }

  /// The global L2 norm of the gradients (exact: the same bits at any world size and placement),
  /// then clips the gradient shards by clip_coefficient(norm, grad_clip); fills stats.grad_norm
  /// and stats.clip_coef. Throws NonFiniteLossError on every rank when the norm is not finite.
  void clip_gradients(StepStats& stats);
  /// One optimizer step on every owned piece at 0-based step `step` (LR schedule), then the
  /// placement's post-step gather. Fills stats.lr_muon and stats.lr_adamw.
  void optimizer_step(int64_t step, StepStats& stats);

 private:
  [[noreturn]] void throw_non_finite(const StepStats& stats);
  void gathered_muon(OwnedPiece& o, double lr);

  UnitBuffers& units_;
  Communicator& comm_;
  const ShardPlan& plan_;
  PlacementTraits traits_;
  const EngineOptions& opts_;
  std::vector<OwnedPiece> pieces_;
  int64_t steps_ = 0;
};

/// Exact sum over ranks: every rank's accumulator is gathered and merged with integer additions,
/// so all ranks get the same bits whatever the rank split (one all_gather_host).
ExactSum all_reduce_exact(Communicator& comm, const ExactSum& local, CommPhase phase);

}  // namespace mfsdp
