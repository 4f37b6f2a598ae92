// The owner planner: ParamInventory + world size + placement -> ShardPlan.
#pragma once
#include <string>

#include "planner/cost_model.h"
#include "planner/param_spec.h"
#include "planner/shard_plan.h"

namespace mfsdp {

/// Largest world size the planner accepts.
inline constexpr int kMaxPlanWorldSize = 1 << 20;

/// Checks an inventory: at least one unit name, unique non-empty names, every dim >= 1, unit
/// indices in range, role `matrix` only on 2-D shapes, qkv_blocks >= 1 and dividing rows of a
/// matrix. Throws std::invalid_argument naming the parameter and the value.
void validate_inventory(const ParamInventory& inv);

/// Plans `inv` over `world_size` ranks (1..kMaxPlanWorldSize). Deterministic: the same input gives
/// the same plan (stable sorts, ties broken by index).
///
/// Routing by logical shape and role: role `matrix` (2-D) -> Muon, everything else -> AdamW.
/// Layouts (segments in rank order form each unit's buffer):
///  - matrixfsdp / zero1: each Muon matrix is one piece on its owner, chosen by
///    longest-processing-time greedy on Newton-Schulz FLOPs (items sorted by FLOPs, then bytes,
///    descending, then inventory index; a matrix goes to the rank with the least FLOPs, then least
///    matrix bytes, then least bytes in the matrix's unit, then lowest index). With
///    options.node_of_rank, ranks on different nodes then trade their whole owner loads where that
///    spreads each unit's matrix bytes over the nodes (every rank's FLOPs and matrix bytes stay the
///    same multiset). AdamW tensors (the
///    tail) are then water-filled into the ranks with the fewest bytes: the tail, ordered by unit
///    then inventory index, is cut into consecutive rank ranges (ranks 0..N-1), so a split tensor's
///    pieces are consecutive ranks; cuts inside small tensors are moved to a tensor edge.
///    In each segment the owned matrices come first, then the tail pieces (inventory order).
///    zero1 uses exactly the matrixfsdp layout.
///    options.round_robin: the naive baseline, parameter k whole on rank k % N.
///  - fsdp2: every tensor split along dim 0, ceil(rows / N) rows reserved per rank (padding after
///    the real rows; padding belongs to no piece).
///  - ddp: one piece per tensor on rank 0 (rank 0's segment is the whole unit), owner -1.
/// Throws std::invalid_argument on a bad inventory, world size or options.
ShardPlan make_plan(const ParamInventory& inv, int world_size, Placement placement,
                    const PlannerOptions& options = {});

/// One line per optimizer: tensors and elements routed to it, e.g.
/// "muon: 48 tensors, 84934656 elements; adamw: 100 tensors, 39470592 elements".
std::string routing_summary(const ShardPlan& plan);

}  // namespace mfsdp
