// Cluster projection: the step time and per-rank memory of a placement at a world size on a
// described cluster, from the plan (owners, shards) and a linear cost model whose constants are
// the cluster's (published or calibrated on this machine by mfsdp-project --calibrate). The model
// comes as a ModelProfile (its inventory and sizes), so the planner names no model family;
// models/model_presets.h makes profiles of the GPT-2 and Llama shapes.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/param_spec.h"
#include "planner/shard_plan.h"
#include "runtime/core/dtype.h"
#include "runtime/core/name_table.h"

namespace mfsdp {

/// A cluster, per device (GPU, or CPU rank). JSON keys are the field names.
struct ClusterSpec {
  std::string name = "cluster";
  double gemm_tflops_bf16 = 0;  ///< dense GEMM rate per device, bf16, TFLOP/s (GPU: the peak; the curve scales it)
  double gemm_tflops_f32 = 0;   ///< the same in f32 (TF32 on GPUs), TFLOP/s
  double ns_efficiency = 1;     ///< Newton-Schulz rate / GEMM rate (matrix shapes, kernel launches)
  double model_efficiency = 0.5;///< forward/backward rate / GEMM rate (attention, norms, kernel mix)
  double mem_GBps = 0;          ///< device memory bandwidth (elementwise optimizer work), GB/s
  double memory_gb = 80;        ///< device memory, GB (1e9 bytes)
  double reserve_gb = 0;        ///< memory not available to tensors (runtime, allocator slack), GB
  int gpus_per_node = 8;        ///< devices sharing the intra-node fabric
  double intra_GBps = 0;        ///< per-device bandwidth inside a node, one direction, GB/s
  double inter_GBps = 0;        ///< per-device bandwidth between nodes, one direction, GB/s
  double intra_latency_us = 0;  ///< per collective hop inside a node
  double inter_latency_us = 0;  ///< per collective hop between nodes
  bool linear_latency = false;  ///< hops per collective: n - 1 (direct MPI) instead of ceil(log2 n)
  int cores_per_node = 0;       ///< > 0: devices are CPU ranks sharing this many cores (rate scaled)
  /// GEMM efficiency over size (projection_terms.h curve_efficiency): points (cbrt(M N K batch),
  /// fraction of gemm_tflops_*); empty = a flat rate (CPU calibration).
  std::vector<std::pair<double, double>> gemm_curve_bf16, gemm_curve_f32;
  double launch_us = 0;         ///< per kernel launch (GPU: host launch + tail), microseconds
  std::string source;           ///< where the rates and the curve come from (citation)

  /// A GPU cluster (cores_per_node <= 0): its runs are resolved for a CUDA device (engine_choices(),
  /// runtime/engine/projection_rules.h); otherwise for the CPU.
  bool gpu() const { return cores_per_node <= 0; }

  /// Reads a cluster JSON (keys above; missing keys keep the defaults). Throws std::runtime_error
  /// naming the file when it cannot be read or a rate is missing / not positive.
  static ClusterSpec load(const std::string& path);
  nlohmann::json to_json() const;
};

/// What the projection needs of a model: its FSDP inventory and the sizes behind its FLOPs and
/// activation memory.
struct ModelProfile {
  std::string name, family;
  ParamInventory inventory;
  int n_layer = 0, n_embd = 0, n_head = 0;
  int64_t vocab = 0;
  /// 6 * N_matmul: the context-free part of the training FLOPs per token (matrices and the head,
  /// not lookups, norms or biases).
  double matmul_flops_per_token = 0;

  /// Parameter count of the inventory.
  int64_t num_params() const;
  /// Training FLOPs per token, forward + backward: 6 * N_matmul + 12 * n_layer * n_embd * context
  /// (PaLM appendix B).
  double flops_per_token(int context) const;
};

/// How the fsdp2 baseline runs Muon at the optimizer step.
enum class BaselineNs {
  every_rank,   ///< all-gather each Muon input, every rank orthogonalizes every matrix (this engine's fsdp2)
  row_sharded,  ///< torch.optim.Muon on FSDP2 DTensors: each rank computes its 1/N of each product's
                ///< rows; per iteration a tall matrix all-reduces its m x m Gram (the A A product then
                ///< runs whole on every rank) and a wide one all-gathers X, A and X again
};
const char* baseline_ns_name(BaselineNs b);
/// Parses "every_rank" | "row_sharded"; throws std::invalid_argument naming the value otherwise.
BaselineNs parse_baseline_ns(const std::string& s);
/// DTensor ops torch.optim.Muon runs for one rows x cols matrix with `steps` Newton-Schulz
/// iterations (listed in projection.cpp): 9 + 2 for a tall matrix + 4 per iteration.
int baseline_dtensor_ops(int64_t rows, int64_t cols, int steps);

/// The fsdp2 baseline's semantics at the optimizer step.
struct BaselineOptions {
  BaselineNs ns = BaselineNs::every_rank;
  std::optional<DType> gather_dtype;  ///< dtype of its Muon-input all-gather; unset = the Newton-Schulz dtype
  std::optional<int> ns_steps;        ///< its Newton-Schulz iterations; unset = ProjectionInput::ns_steps
  /// row_sharded only: host-side dispatch of each DTensor op (baseline_dtensor_ops per matrix),
  /// added to the device time, microseconds. 90: the dispatch time PyTorch's DTensor overhead
  /// test expects of a sharded op on CUDA (pytorch/pytorch#159699; addmm measured 341-476 us
  /// in pytorch/pytorch#107305).
  double host_op_us = 90;
  /// One line naming each choice, e.g. "fsdp2 baseline: every_rank Newton-Schulz, gather bf16, NS 5".
  std::string describe(DType ns_dtype, int ns_steps_default) const;
};

/// The dtype `asked` (bf16, f32 or unset for auto) runs in on cluster `c`: auto is bf16 on a GPU
/// cluster and, on a calibrated CPU one, bf16 only where its gemm_tflops_bf16 pays over
/// gemm_tflops_f32 (runtime/core/gemm_rates.h bf16_pays, the trainer's rule), else f32.
DType resolve_projection_dtype(std::optional<DType> asked, const ClusterSpec& c);

/// What to project.
struct ProjectionInput {
  ModelProfile model;
  Placement placement = Placement::matrixfsdp;
  int replicas = 1;                 ///< HSDP: R replicas of world / R shard ranks
  int ns_steps = 5;
  DType dtype = DType::bf16;        ///< compute and communication dtype: bf16 (mixed, f32 master) or f32
  DType ns_dtype = DType::bf16;     ///< Newton-Schulz dtype (bf16 or f32)
  int batch = 1, seq = 1024;        ///< sequences x tokens per rank per step
  bool activation_checkpointing = false;
  /// The engine's switches as asked for, in EngineOptions' types (runtime/engine/engine_options.h):
  /// unset / automatic leave the choice to the engine's device default, which only the engine's
  /// rulebook states (engine_choices(), runtime/engine/projection_rules.h).
  std::optional<int> prefetch_depth;             ///< units gathered ahead
  Toggle overlap_reduce = Toggle::automatic;      ///< reductions overlap the next unit's backward
  Toggle batch_orthogonalize = Toggle::automatic; ///< an owner's same-shape matrices in one batched chain
  bool round_robin_owners = false;  ///< owners k % N (PlannerOptions::round_robin) instead of LPT
  BaselineOptions baseline;         ///< the fsdp2 placement's optimizer-step semantics
};

/// What the engine would do for a projected run: ProjectionInput's switches resolved by the
/// engine's rulebook for the cluster's device, placement and replicas (engine_choices(),
/// runtime/engine/projection_rules.h). The projection applies these and states no default or
/// rule of its own.
struct EngineChoices {
  int prefetch_depth = 0;            ///< units gathered ahead (>= 0)
  bool overlap_reduce = false;       ///< reductions overlap the next unit's backward
  bool batch_orthogonalize = false;  ///< an owner's same-shape matrices in one batched chain
  PlannerOptions planner;            ///< the owner planner's options (planner_options() + round_robin)
};

/// Predicted step of one rank (the slowest). Times in ms, memory in GB (1e9 bytes).
struct Projection {
  int world = 1, replicas = 1;
  double forward_ms = 0, backward_ms = 0, reduce_ms = 0, optimizer_ms = 0, step_ms = 0;
  /// Parts of optimizer_ms: the slowest rank's Newton-Schulz, its elementwise work, the step's
  /// collectives (fsdp2's gathers or row_sharded exchanges, zero1's parameter gather) and host_ms.
  double ns_ms = 0, elementwise_ms = 0, opt_comm_ms = 0;
  double host_ms = 0;  ///< row_sharded fsdp2: host dispatch of its DTensor ops (BaselineOptions::host_op_us)
  /// Communication not hidden behind compute: gathers compute waited for, and reductions.
  double exposed_gather_ms = 0;
  /// Memory (planner/memory_plan.h): persistent state, gathered units with their gradients,
  /// activations with the classifier's chunk, the optimizer step's Newton-Schulz (transient_gb);
  /// total = persistent + max(gathered + activations, transient).
  double persistent_gb = 0, gathered_gb = 0, activations_gb = 0, transient_gb = 0, total_gb = 0;
  bool oom = false;
  nlohmann::json to_json() const;
};

/// The projection of `in` at `world` ranks on `cluster`. Model (cost terms in projection_terms.h):
///  - compute per unit: each matrix's GEMM (tokens x fan_out x fan_in) and the attention products
///    and head at their shapes on the cluster's GEMM curve (gemm_seconds), / model_efficiency;
///    backward 2x forward (+1x with checkpointing); rate per device, scaled by cores / ranks on
///    shared CPU nodes;
///  - a collective over n ranks moving X bytes per rank (the communicator's direct-model bytes):
///    X / bw + hops(n) * latency, with the intra-node bandwidth when the group fits in a node;
///  - gathers (non-resident placements): the parameters at the compute dtype, forward and backward;
///    gradient reduction: reduce-scatter (all-reduce for ddp); HSDP adds the replica chain of
///    the engine (R reduce-scatters in turn, R - 1 hops and a broadcast of the owned shard);
///  - the step's schedule (schedule_units): gathers prefetched engine.prefetch_depth units ahead
///    and reductions overlapped with the next unit's backward when engine.overlap_reduce, as the
///    engine runs them;
///  - optimizer: the slowest rank's Newton-Schulz (newton_schulz_seconds over its owned matrices,
///    same shapes batched when engine.batch_orthogonalize; fsdp2 per `baseline`; every matrix on every
///    rank for ddp), AdamW and Muon elementwise bytes / mem_GBps, plus fsdp2's collectives and
///    zero1's all-gather of the updated parameters;
///  - memory: the rank that needs most under the memory plan the trainer checks at start-up
///    (planner/memory_plan.h: stored segments, gradients and owned state, the gathered units of
///    the schedule, the Newton-Schulz workspace, activations and the fused classifier's chunk).
///    OOM when memory_needed(total) (the plan's margin, and a CPU rank's process bytes) exceeds
///    memory - reserve, the trainer's start-up rule.
/// `engine`: the schedule, batching and planner options the engine would use (EngineChoices; the
/// overload project(in, cluster, world) in runtime/engine/projection_rules.h resolves them).
/// Throws std::invalid_argument when replicas is < 1 or does not divide world.
Projection project(const ProjectionInput& in, const ClusterSpec& cluster, int world, const EngineChoices& engine);

}  // namespace mfsdp
