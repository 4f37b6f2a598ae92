// The run's memory plan per rank (planner/memory_plan.h) checked against what the node gives the
// rank, before the engine allocates anything or any weights move (sharding.memory_check).
#pragma once
#include <functional>
#include <string>

#include "apps/train/train_config.h"
#include "comm/communicator.h"
#include "planner/memory_plan.h"
#include "runtime/engine/resolve.h"

namespace mfsdp {

/// The bytes a rank may use and where the figure comes from.
struct RankMemory {
  double bytes = 0;    ///< 0: unknown (the check is skipped, with a notice)
  std::string source;  ///< e.g. "cgroup v1 memory.limit_in_bytes 9.00 GiB, / 4 ranks on the node"
};

/// CUDA: the free memory of the rank's GPU (cudaMemGetInfo). CPU: the node's memory, the smaller
/// of /proc/meminfo's MemAvailable and the job's cgroup limit (cgroup v2 memory.max or v1
/// memory.limit_in_bytes, the tightest along the process's cgroup path), divided by `local_ranks`.
RankMemory rank_memory_available(Device device, int local_ranks);

/// The plan options of a run whose engine options resolved to `resolved`, with matmuls in `matmul`.
MemoryPlanOptions memory_plan_options(const TrainConfig& cfg, const ResolvedOptions& resolved, DType matmul);

/// Plans this rank's memory under `plan`; rank 0 prints the worst rank's plan, "memory plan: X
/// persistent + Y peak transient per rank (rank R; largest: ...); Z available per rank (source)". Unless
/// sharding.memory_check is off, compares memory_needed(plan) (planner/memory_plan.h: the margin
/// and, on CPU, the process's own bytes) with the available bytes on every rank and agrees on the verdict with one
/// scalar all-reduce over `comm` (and `replicas`): when any rank's plan does not fit, error
/// throws InputError on every rank (the message names the largest terms and what would fit:
/// `replan(placement)` for the other placements, training.recompute=block, a smaller micro-batch,
/// more ranks) and warn prints it on each rank that is short and goes on. A rank whose available
/// memory is unknown counts as fitting (and still joins the all-reduce). Returns the plan.
MemoryPlan check_memory_plan(const TrainConfig& cfg, Communicator& comm, Communicator* replicas, const ShardPlan& plan,
                             const MemoryModel& model, const MemoryPlanOptions& opts, int local_ranks,
                             const std::function<ShardPlan(Placement, int world)>& replan);

}  // namespace mfsdp
