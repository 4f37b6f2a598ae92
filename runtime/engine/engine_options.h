// The engine's options, its per-step report and its errors.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>

#include "optim/adamw.h"
#include "optim/muon.h"
#include "optim/schedule.h"
#include "runtime/core/dtype.h"
#include "runtime/core/name_table.h"
#include "runtime/ops.h"

namespace mfsdp {

/// Optimizer and step hyperparameters of the engine. Options that depend on the device or on each
/// other are checked and given their device defaults by resolve() (runtime/engine/resolve.h).
/// AdamW weight decay applies to 2-D AdamW tensors (embeddings, untied head) only; norms and
/// biases are never decayed (the nanoGPT/GPT-2 convention). Muon decays its matrices.
struct EngineOptions {
  MuonOptions muon;     ///< the Muon group, with its base learning rate muon.lr
  AdamWOptions adamw;   ///< the AdamW group, with its base learning rate adamw.lr
  LRSchedule schedule;  ///< both groups follow it, each from its own base lr
  double grad_clip = 1.0;  ///< global-norm clipping threshold on raw gradients (<= 0 disables)
  /// QK-Clip threshold tau of MuonClip (Kimi K2, arXiv 2507.20534, section 2.1); 0 = off. After
  /// each optimizer step, every attention head whose largest pre-softmax logit q.k/sqrt(d) of
  /// the step (over all ranks' micro-batches) exceeds tau has its query rows and key rows (the
  /// model's UnitModel::attention_heads) multiplied by sqrt(tau / max_logit).
  double qk_clip = 0.0;
  /// Orthogonalize each unit's Muon matrices as soon as its last micro-batch's gradient reduction
  /// lands, during the backward of earlier units; the updates are applied in the optimizer phase.
  /// Bitwise equal to the non-overlapped step; needs grad_clip <= 0 (clipping would change the
  /// Muon input after the whole backward). Costs one matrix-sized buffer per owned Muon matrix.
  bool overlap_backward = false;
  /// Mixed precision, PyTorch FSDP's MixedPrecision split: `param_dtype` is the dtype of the
  /// gathered parameters (bf16: all-gathers move bf16 and parameters hold bf16-rounded values)
  /// and, unless matmul_dtype says otherwise, of the matmuls (ops.h matmul_dtype: bf16 operands,
  /// f32 accumulation); `reduce_dtype` is
  /// the dtype of gradient contributions on the wire (owners add them in f32). Master shards,
  /// gradients on owners and optimizer state stay f32. param_dtype bf16 needs a sharded placement.
  DType param_dtype = DType::f32;
  DType reduce_dtype = DType::f32;
  /// The dtype of the matmuls when it differs from param_dtype (f32 or bf16; unset: param_dtype).
  /// bf16 parameters with f32 matmuls keep the halved gathers where bf16 GEMMs are slower.
  std::optional<DType> matmul_dtype;
  /// The dtype the matmuls run in: matmul_dtype, else param_dtype.
  DType matmuls() const { return matmul_dtype.value_or(param_dtype); }
  /// Activation recompute per FSDP unit (named "block"; off is "none", kRecomputeNames): the forward keeps
  /// only each unit's input; the backward re-runs the unit's forward before differentiating it.
  /// Bitwise equal to recompute off; the last unit (the loss head) is never recomputed.
  bool recompute_units = false;
  /// FSDP prefetching (sharded placements): while unit u computes, the gathers of the units the
  /// next `prefetch_depth` units need are started (Communicator::start_all_gather_v; on CUDA with
  /// NCCL they run on the comm stream), in the forward and in the backward (>= 0). Unset = the
  /// device's default: 1 on CUDA, 0 on CPU (MPI progresses a started gather only inside MPI calls, so on
  /// CPU prefetching costs memory and gains little). `prefetch_limit_bytes` > 0 caps the gathered
  /// parameter bytes a prefetch may bring a rank to; the gather a unit needs now is never refused.
  /// Results are bitwise equal at every depth.
  std::optional<int> prefetch_depth;
  int64_t prefetch_limit_bytes = 0;
  /// Experts stay with their owners (Mixture-of-Experts models, matrixfsdp): each routed
  /// expert's matrices have one owner (PlannerOptions::expert_parallel) and are never gathered;
  /// during training steps and evaluations each rank sends the rows routed to an expert to its
  /// owner and gets the outputs back (Communicator::all_to_all_v), and in the backward the output
  /// gradients go to the owner, which adds every rank's weight gradient in rank order (no
  /// reduction of expert gradients). Bitwise equal to gathered experts at the same world size.
  /// CPU, f32 parameters and reductions, no replicas, no recompute, no overlap_backward.
  bool expert_parallel = false;
  /// Orthogonalize an owner's same-shape Muon matrices together (one strided-batched bf16
  /// Newton-Schulz chain per shape on CUDA; on the CPU small matrices, min(rows, cols) < 256, run
  /// across the batch on the OpenMP threads instead of one band each), no padding; automatic = on
  /// for both devices. Bitwise equal either way; costs one batch buffer and a momentum copy.
  Toggle batch_orthogonalize = Toggle::automatic;
  /// The attention kernel of every forward and backward (ops.h AttentionKernel; names:
  /// kAttentionNames; unset is "auto"): cudnn (cuDNN's fused attention in bf16, CUDA builds with cuDNN, head sizes
  /// 64 and 128), fused (flash attention in f32), unfused (the reference, probabilities [B,H,T,T]
  /// kept for backward) or unset, chosen by resolve(): cudnn on CUDA when the build has it, the
  /// heads have 64 or 128 features and matmuls run in bf16 (param_dtype bf16), else fused on CUDA
  /// and unfused on the CPU. The kernels are not bitwise equal to each other (sums run in other
  /// orders; cudnn rounds its operands to bf16); each is deterministic.
  std::optional<AttentionKernel> attention;
  /// Backward: unit u's gradient reduction to the owners is started (Communicator::
  /// start_reduce_scatter_v) and finished after unit u-1's backward, so the two overlap (NCCL: on
  /// the comm stream); automatic = on for CUDA only (MPI advances the messages only inside MPI
  /// calls). Owner reductions without replicas only; bitwise equal either way.
  Toggle overlap_reduce = Toggle::automatic;
};

/// The names of EngineOptions::param_dtype and reduce_dtype: "f32", "bf16" (kDTypeNames' floating types).
inline constexpr NameTable<DType, 2> kPrecisionNames{
    {{{DType::f32, kDTypeNames.name(DType::f32)}, {DType::bf16, kDTypeNames.name(DType::bf16)}}}};
/// The names of EngineOptions::attention: "auto" (unset), then ops.h's kernel names "cudnn", "fused", "unfused".
inline constexpr NameTable<std::optional<AttentionKernel>, 4> kAttentionNames{
    {{{std::nullopt, "auto"},
      {AttentionKernel::cudnn, kAttentionKernelNames.name(AttentionKernel::cudnn)},
      {AttentionKernel::fused, kAttentionKernelNames.name(AttentionKernel::fused)},
      {AttentionKernel::unfused, kAttentionKernelNames.name(AttentionKernel::unfused)}}}};
/// The names of EngineOptions::recompute_units: "none" (false), "block" (true).
inline constexpr NameTable<bool, 2> kRecomputeNames{{{{false, "none"}, {true, "block"}}}};

/// Thrown by train_step when the global loss or the global gradient norm is NaN or Inf (checked
/// before any optimizer step, with clipping on or off); parameters and optimizer state are left
/// untouched. The message names the step, the value and, for the gradient, the first tensor (in
/// plan order) whose gradient is not finite on some rank.
class NonFiniteLossError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Seconds spent in each phase of a step: forward (the whole forward pass), backward (the units'
/// backward, gathers included), reduce (gradient reductions to the owners, waits included),
/// optimizer (clipping and the optimizer step) and total (the whole step).
struct PhaseTimes {
  double forward = 0, backward = 0, reduce = 0, optimizer = 0, total = 0;
};

/// What one optimizer step did, the same on every rank. loss is the mean over every rank's tokens
/// and micro-batches; grad_norm is the global norm before clipping. `seconds` are each phase's
/// maximum over ranks (the slowest rank sets the pace); seconds.total is the whole step on the
/// slowest rank.
struct StepStats {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, clip_coef = 1, lr_muon = 0, lr_adamw = 0;
  PhaseTimes seconds;
  /// overlap_backward: seconds spent orthogonalizing during backward (this rank; inside no other
  /// phase's time, part of t_total).
  double t_overlap = 0;
  int64_t tokens = 0;  ///< tokens in the global batch
  /// QK-Clip (EngineOptions::qk_clip > 0 only): the largest attention logit of the step over all
  /// heads and ranks, and how many heads were rescaled.
  double max_attention_logit = 0;
  int64_t qk_clipped_heads = 0;
  /// Telemetry of this rank (not reduced; the trainer logs rank 0's), to catch silent fallbacks:
  /// orthogonalizations run in the step (= the Muon matrices it owns; all of them under fsdp2),
  /// bytes it sent in the optimizer phase (0 under matrixfsdp), and bytes copied between host
  /// and device by tensor copies (0 on CPU; on CUDA the token batches and a few scalars, so
  /// weight-sized traffic means some work fell back to the host).
  int64_t orthogonalizations = 0;
  int64_t optimizer_step_bytes = 0;
  int64_t host_device_bytes = 0;
  /// Unit gradient reductions of the step that ran behind the backward (started, then finished
  /// later: UnitBuffers::overlapped_reductions); 0 without sharding.overlap_reduce.
  int64_t overlapped_reductions = 0;
};

/// One kind of per-element training state: the parameter itself, the first optimizer moment
/// (Muon momentum or AdamW m) and AdamW's second moment v. Names: "param", "m", "v".
enum class StateKind : int { param = 0, m = 1, v = 2 };
const char* state_kind_name(StateKind k);

}  // namespace mfsdp
