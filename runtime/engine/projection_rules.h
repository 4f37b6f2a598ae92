// The engine's rulebook applied to a cluster projection: the switches of a ProjectionInput
// (planner/projection.h) resolved by resolve() for the cluster's device, so the projection runs
// a step with the prefetch depth, overlap, batching and owner planning the engine would use,
// without a default or rule of its own.
#pragma once
#include "planner/projection.h"

namespace mfsdp {

/// The engine's choices for a projected run of `in` on `cluster`: an EngineOptions with in's
/// switches (prefetch_depth, overlap_reduce, batch_orthogonalize) and muon.ns_steps = in.ns_steps,
/// resolved by resolve() for Device::CUDA on a GPU cluster (cluster.gpu()) or Device::CPU on a
/// calibrated CPU one, at in.placement and in.replicas, for a model without attention-head rules;
/// the planner options are planner_options() of the result with round_robin = in.round_robin_owners.
/// Throws OptionError (std::invalid_argument) as resolve() does, e.g. for ddp with replicas > 1.
EngineChoices engine_choices(const ProjectionInput& in, const ClusterSpec& cluster);

/// The projection of `in` at `world` ranks on `cluster` as the engine would run it:
/// project(in, cluster, world, engine_choices(in, cluster)). Throws as both do.
inline Projection project(const ProjectionInput& in, const ClusterSpec& cluster, int world) {
  return project(in, cluster, world, engine_choices(in, cluster));
}

}  // namespace mfsdp
