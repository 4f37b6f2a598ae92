// The memory of one rank for a run, term by term (bytes): the one model behind the trainer's
// start-up check, mfsdp-plan's capacity table and the cluster projection (planner/projection.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/shard_plan.h"
#include "runtime/core/dtype.h"

namespace mfsdp {

/// The largest batch of same-shape matrices an owner orthogonalizes in one chain
/// (batch_orthogonalize; runtime/engine/owner_state.h): its Muon inputs' bytes, at least one matrix.
inline constexpr int64_t kNewtonSchulzBatchBytes = int64_t(256) << 20;

/// What the memory plan needs of a model besides its ShardPlan (planner/projection.h's
/// ModelProfile gives these for projections; the trainer from its config).
struct MemoryModel {
  int n_layer = 0, n_embd = 0, n_head = 0;
  int64_t padded_vocab = 0;  ///< rows of the classifier (Vp)
};

/// How the run holds its transient tensors.
struct MemoryPlanOptions {
  int micro_batch = 1, seq = 1024;  ///< sequences x tokens per micro-batch
  DType param_dtype = DType::f32;   ///< gathered parameters (bf16: plus the f32 copy the unit keeps)
  DType compute_dtype = DType::f32; ///< activations and matmul operands (bf16 halves the activations)
  bool recompute = false;           ///< training.recompute=block: unit inputs kept, one unit's activations
  int prefetch_depth = 0;           ///< units gathered ahead of the one computing
  bool overlap_reduce = false;      ///< a unit's full gradients wait for their reduction one unit longer
  bool batch_orthogonalize = false; ///< an owner's same-shape matrices in chains of kNewtonSchulzBatchBytes
};

/// One rank's planned bytes by term (planner/README.md, "Memory"); the peak is the persistent terms plus
/// the larger phase of transient ones:
///  - persistent: the stored parameter segments and gradients (f32; resident placements every
///    unit whole, zero1 also the owner's reduced gradient segment) and the owned optimizer state
///    (Muon momentum 4 B, AdamW m and v 8 B per element);
///  - transient: the gathered units in flight (prefetch depth + 1 consecutive units, the f32 buffer
///    plus a bf16 wire copy under bf16 parameters), the full gradients of one unit (two with
///    overlapped reductions), the Newton-Schulz workspace of the largest matrix this rank
///    orthogonalises (fsdp2: also its gathered input and update; batched: the largest chain of
///    same-shape matrices, up to kNewtonSchulzBatchBytes of inputs), the saved activations of one
///    micro-batch (Korthikanti et al. 2022; with recompute: the unit inputs plus one layer's) and the
///    fused classifier's chunk (runtime/core/classifier_memory.h).
struct MemoryPlan {
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double gathered_params = 0, gathered_grads = 0, newton_schulz = 0, activations = 0, classifier = 0;

  double persistent() const { return parameters + gradients + optimizer_state; }
  /// The larger of the two phases that hold transient tensors: forward and backward (gathered
  /// units, their gradients, activations, the classifier) and the optimizer step (Newton-Schulz).
  double transient() const {
    return std::max(gathered_params + gathered_grads + activations + classifier, newton_schulz);
  }
  double total() const { return persistent() + transient(); }
  /// Every term as (name, bytes) in the order above: the names summary.json and refusals use.
  std::vector<std::pair<std::string, double>> terms() const;
};

/// The plan of `rank` (0 <= rank < plan.world_size). Throws std::invalid_argument for a rank out
/// of range.
MemoryPlan plan_memory(const ShardPlan& plan, const MemoryModel& model, const MemoryPlanOptions& opts, int rank);

/// The plan of the rank with the largest total (the one that runs out first); `rank_out`, when
/// given, receives its index.
MemoryPlan plan_memory_worst(const ShardPlan& plan, const MemoryModel& model, const MemoryPlanOptions& opts,
                             int* rank_out = nullptr);

/// Share of the plan a rank keeps free beyond it (allocator slack, buffers the plan does not name).
inline constexpr double kMemoryPlanMargin = 0.10;
/// The bytes `total` planned bytes need of a rank's memory: the plan, kMemoryPlanMargin of it and
/// `process_bytes`, what the process holds outside the planned tensors (a CPU rank's code, MPI and
/// oneDNN buffers: kCpuProcessBytes; a GPU's context is outside its free memory already). The one
/// fit rule of the trainer's start-up check, the projection's OOM verdict and the capacity table.
inline double memory_needed(double total, double process_bytes) { return total * (1 + kMemoryPlanMargin) + process_bytes; }
/// A CPU rank's resident memory beyond its tracked tensors, measured at W=4 (anonymous peak minus
/// tracked peak): 112 MiB before the model is built; 172-185 MiB for GPT-2 124M (B=1, T=256, ddp and
/// matrixfsdp) and 183-254 MiB for GPT-2 medium widths (T=64), with the host block cache bounded
/// by the peak (runtime/block_cache.h). Rounded up.
inline constexpr double kCpuProcessBytes = 320.0 * (1 << 20);

/// Saved activation bytes of one token of one transformer layer at `context` with 4-byte values:
/// 2 * (34 * C + 5 * n_head * context) (Korthikanti et al. 2022, eq. 1, which counts 2-byte values).
double activation_bytes_per_token_layer(const MemoryModel& model, int context);

}  // namespace mfsdp
