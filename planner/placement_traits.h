// A placement as one row of behaviour flags, computed once, so the engine's step schedule and the
// planner's projection ask a question ("are parameters resident?") instead of naming a placement.
#pragma once
#include "planner/shard_plan.h"

namespace mfsdp {

/// How a placement stores, reduces and updates (see runtime/README.md, "Placements"):
///
/// | placement  | resident | grad reduction          | updaters   | Muon input | gather after step |
/// |------------|----------|-------------------------|------------|------------|-------------------|
/// | matrixfsdp | no       | reduce-scatter, per mb  | owners     | local      | no                |
/// | fsdp2      | no       | reduce-scatter, per mb  | owners     | gathered   | no                |
/// | zero1      | yes      | reduce-scatter, last mb | owners     | local      | yes               |
/// | ddp        | yes      | all-reduce, last mb     | every rank | local      | no                |
///
/// HSDP (replicate x shard, `replicated`): any row but ddp over a shard group of W/R ranks, with
/// R replicas of that group; each owner's reduced gradients are also summed over its R replica
/// owners (a rank-ordered chain, then a broadcast), so replicas stay bitwise identical.
struct PlacementTraits {
  /// Full parameters and full gradients live on every rank between steps (no gathers); gradients
  /// of the micro-batches accumulate locally and are reduced after the last one only.
  bool resident = false;
  /// Gradients are all-reduced (every rank gets all of them) instead of reduce-scattered to owners.
  bool all_reduce_gradients = false;
  /// Every rank holds and updates every piece (ddp); otherwise each piece has one owner rank.
  bool every_rank_updates_all = false;
  /// The Muon input is all-gathered from row shards at the step and Newton-Schulz runs on every
  /// rank (stock FSDP2 + Muon); otherwise the owner holds the whole matrix.
  bool gathered_muon_input = false;
  /// Owners' updated segments are all-gathered back into every rank's resident parameters.
  bool gather_after_step = false;
  /// HSDP: the communicator is one of R > 1 replica shard groups; gradients reduced to an owner
  /// are chained through the owners of the same segment in the other replicas (see UnitBuffers).
  bool replicated = false;

  /// Every rank runs Newton-Schulz on every Muon matrix (a gathered Muon input, or ddp's update
  /// everywhere); otherwise each matrix is orthogonalized on its owner only.
  bool every_rank_orthogonalizes() const { return gathered_muon_input || every_rank_updates_all; }
  /// HSDP applies: the placement shards over a group that can be replicated (every row but ddp's,
  /// which is already all replicas).
  bool replicable() const { return !every_rank_updates_all; }
};

/// The row of `p`, replicated over shard groups (HSDP) when `replicated` and the row is
/// replicable() (resolve(), runtime/engine/resolve.h, refuses replicas > 1 otherwise).
inline PlacementTraits placement_traits(Placement p, bool replicated = false) {
  const bool rep = replicated;
  switch (p) {
    case Placement::matrixfsdp: return {false, false, false, false, false, rep};
    case Placement::fsdp2: return {false, false, false, true, false, rep};
    case Placement::zero1: return {true, false, false, false, true, rep};
    case Placement::ddp: return {true, true, true, false, false, false};
  }
  return {};
}

}  // namespace mfsdp
