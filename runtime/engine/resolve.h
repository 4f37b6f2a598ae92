// The engine's rulebook: every rule that ties options to each other, to the device, to the
// placement or to the model, and every device default, in one function that the engine's
// constructor and the training config parser both call.
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "planner/shard_plan.h"
#include "runtime/core/dtype.h"
#include "runtime/core/name_table.h"
#include "runtime/engine/engine_options.h"
#include "planner/placement_traits.h"
#include "runtime/ops.h"

namespace mfsdp {

class UnitModel;

/// The inputs resolve() can reject, by their engine identifiers (EngineOptions member paths and
/// the engine's device, placement and replica count). A caller maps them to its own names.
enum class OptionField {
  device, placement, replicas, param_dtype, reduce_dtype, grad_clip, qk_clip, overlap_backward,
  prefetch_depth, prefetch_limit_bytes, muon_split_heads, muon_orthogonalizer, muon_variant, muon_ns_dtype,
  attention, expert_parallel
};
/// The identifiers of OptionField ("device", ..., "muon.split_heads", "muon.ns_dtype", "attention").
inline constexpr NameTable<OptionField, 16> kOptionFieldNames{{{
    {OptionField::device, "device"},
    {OptionField::placement, "placement"},
    {OptionField::replicas, "replicas"},
    {OptionField::param_dtype, "param_dtype"},
    {OptionField::reduce_dtype, "reduce_dtype"},
    {OptionField::grad_clip, "grad_clip"},
    {OptionField::qk_clip, "qk_clip"},
    {OptionField::overlap_backward, "overlap_backward"},
    {OptionField::prefetch_depth, "prefetch_depth"},
    {OptionField::prefetch_limit_bytes, "prefetch_limit_bytes"},
    {OptionField::muon_split_heads, "muon.split_heads"},
    {OptionField::muon_orthogonalizer, "muon.orthogonalizer"},
    {OptionField::muon_variant, "muon.variant"},
    {OptionField::muon_ns_dtype, "muon.ns_dtype"},
    {OptionField::attention, "attention"},
    {OptionField::expert_parallel, "expert_parallel"},
}}};

/// A rejected option. `field()` is the option at fault; the message may name other options, each
/// written as a reference that message() renders through the caller's naming (what() renders the
/// engine identifiers: "[resolve] overlap_backward: needs grad_clip = 0 (got 1) ...").
class OptionError : public std::invalid_argument {
 public:
  /// `text` refers to other options as "{identifier}" (an identifier of kOptionFieldNames).
  OptionError(OptionField field, std::string text);
  OptionField field() const { return field_; }
  /// The message without the field, each {identifier} replaced by name(field).
  std::string message(const std::function<std::string(OptionField)>& name) const;

 private:
  OptionField field_;
  std::string text_;
};

/// What resolve() needs of the model: the rows per attention head of its split matrices (0 when it
/// has none), whether it reports attention heads for QK-Clip (UnitModel::attention_heads
/// non-empty) and the features per head of its attention (d; 0 when unknown or none).
struct ModelFacts {
  int64_t attention_head_dim = 0;
  bool reports_attention_heads = false;
  int64_t attention_head_size = 0;
};
/// The facts of a built model.
ModelFacts model_facts(const UnitModel& model);

/// The planner options that match engine options `o` on a model: Newton-Schulz steps, split_qkv,
/// the orthogonalizer, and (split_heads) the model's attention_head_dim, so the owners are
/// balanced on the FLOPs the engine will run. The one source of PlannerOptions for a run.
PlannerOptions planner_options(const EngineOptions& o, const ModelFacts& model);

/// The attention kernel for `asked` (EngineOptions::attention; unset = automatic), resolve()'s rule: cudnn is refused
/// (OptionError on OptionField::attention) on the CPU, when `cudnn_built` is false (the build has
/// no cuDNN: ops.h cudnn_attention_built()) and for a head size other than 64 or 128; automatic
/// is cudnn on CUDA when all of that holds and `param_dtype` is bf16, else fused on CUDA and
/// unfused on the CPU; fused and unfused are taken as asked.
AttentionKernel resolve_attention(std::optional<AttentionKernel> asked, Device device, DType param_dtype, int64_t head_size,
                                  bool cudnn_built);

/// Options with every rule checked and every device default applied. Each resolved fact is held
/// once, in `options`; the accessors read it.
struct ResolvedOptions {
  /// The input with muon.head_dim set (split_heads), no Toggle left automatic, and prefetch_depth
  /// and the attention kernel set.
  EngineOptions options;
  PlacementTraits traits;  ///< the placement's row, replicated when replicas > 1
  int prefetch_depth() const { return options.prefetch_depth.value(); }
  bool batch_orthogonalize() const { return options.batch_orthogonalize == Toggle::on; }
  bool overlap_reduce() const { return options.overlap_reduce == Toggle::on; }
  AttentionKernel attention() const { return options.attention.value(); }
};

/// Checks `in` against itself, the device, the placement replicated `replicas` times and the model,
/// and applies the device defaults: prefetch_depth 1 on CUDA, 0 on CPU; the attention kernel by
/// resolve_attention (with this build's cuDNN and the model's head size); batch_orthogonalize
/// and overlap_reduce on for CUDA only (overlap_reduce is off, whatever asked, with
/// replicas > 1 or all-reduced gradients: the replica chain and ddp's all-reduce block). Rules, each reported as an OptionError on
/// the field named first: replicas >= 1, not > 1 with ddp nor with overlap_backward; param_dtype
/// and reduce_dtype f32 or bf16, param_dtype bf16 only under a sharded (non-resident) placement;
/// qk_clip finite and >= 0, and > 0 only for a model that reports heads; muon.split_heads only for
/// a model with heads; prefetch_depth and prefetch_limit_bytes >= 0; overlap_backward only with
/// grad_clip <= 0; muon.ns_dtype bf16 not with gram_newton_schulz; on CUDA, muon.orthogonalizer
/// newton_schulz5 and muon.variant muon only (the CUDA kernels implement Keller Jordan's Muon).
ResolvedOptions resolve(const EngineOptions& in, Device device, Placement placement, int replicas,
                        const ModelFacts& model);

}  // namespace mfsdp
