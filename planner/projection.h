// Cluster projection: the step time and per-rank memory of a placement at a world size on a
// described cluster, from the plan (owners, shards) and a linear cost model whose constants are
// the cluster's (published or calibrated on this machine by mfsdp-project --calibrate). The model
// comes as a ModelProfile (its inventory and sizes), so the planner names no model family;
// models/model_presets.h makes profiles of the GPT-2 and Llama shapes.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/param_spec.h"
#include "planner/shard_plan.h"

namespace mfsdp {

/// A cluster, per device (GPU, or CPU rank). JSON keys are the field names.
struct ClusterSpec {
  std::string name = "cluster";
  double gemm_tflops_bf16 = 0;  ///< achieved dense GEMM rate per device, bf16, TFLOP/s
  double gemm_tflops_f32 = 0;   ///< achieved dense GEMM rate per device, f32 (TF32 on GPUs), TFLOP/s
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
  /// Activation bytes per token per layer kept for backward without activation checkpointing, at
  /// 4-byte values: 2 * (34 * C + 5 * n_head * context) (Korthikanti et al. 2022, "Reducing
  /// Activation Recomputation in Large Transformer Models", eq. 1, which counts 2-byte values).
  /// An estimate for OOM verdicts only.
  double activation_bytes_per_token_layer(int context) const;
};

/// What to project.
struct ProjectionInput {
  ModelProfile model;
  Placement placement = Placement::matrixfsdp;
  int replicas = 1;                 ///< HSDP: R replicas of world / R shard ranks
  int ns_steps = 5;
  std::string dtype = "bf16";       ///< compute and communication dtype: bf16 (mixed, f32 master) or f32
  std::string ns_dtype = "bf16";    ///< Newton-Schulz dtype
  int batch = 1, seq = 1024;        ///< sequences x tokens per rank per step
  bool activation_checkpointing = false;
};

/// Predicted step of one rank (the slowest). Times in ms, memory in GB (1e9 bytes).
struct Projection {
  int world = 1, replicas = 1;
  double forward_ms = 0, backward_ms = 0, reduce_ms = 0, optimizer_ms = 0, step_ms = 0;
  double persistent_gb = 0, gathered_gb = 0, activations_gb = 0, transient_gb = 0, total_gb = 0;
  bool oom = false;
  nlohmann::json to_json() const;
};

/// The projection of `in` at `world` ranks on `cluster`. Model (no overlap of compute and
/// communication, as in the engine's step schedule):
///  - compute: flops_per_token * tokens (1/3 forward, 2/3 backward, +1/3 with checkpointing) /
///    (rate * model_efficiency); rate per device, scaled by cores / ranks on shared CPU nodes;
///  - a collective over n ranks moving X bytes per rank (the communicator's direct-model bytes):
///    X / bw + hops(n) * latency, with the intra-node bandwidth when the group fits in a node;
///  - gathers (non-resident placements): the parameters at the compute dtype, forward and backward;
///    gradient reduction: reduce-scatter (all-reduce for ddp); HSDP adds the replica chain of
///    the engine (R reduce-scatters in turn, R - 1 hops and a broadcast of the owned shard);
///  - optimizer: the slowest rank's Newton-Schulz FLOPs (cost_model.h muon_flops over its owned
///    matrices; every matrix on every rank for fsdp2 and ddp) / (rate * ns_efficiency), AdamW and
///    Muon elementwise bytes / mem_GBps, plus fsdp2's all-gather of the Muon inputs and zero1's
///    all-gather of the updated parameters;
///  - memory: f32 master parameters, gradients and state (12 B Muon, 16 B AdamW per element,
///    owned or resident), two gathered units, fsdp2's full Muon input and update, activations
///    (ModelProfile::activation_bytes_per_token_layer; checkpointing keeps one layer's inputs per
///    layer), logits and their gradient in f32. OOM when the total exceeds memory - reserve.
/// Throws std::invalid_argument when replicas does not divide world or is > 1 with ddp.
Projection project(const ProjectionInput& in, const ClusterSpec& cluster, int world);

}  // namespace mfsdp
