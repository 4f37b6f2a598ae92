#include "runtime/engine/resolve.h"

#include <cmath>
#include <sstream>

#include "runtime/cuda/cudnn_attention.h"
#include "runtime/engine/projection_rules.h"
#include "runtime/engine/unit_model.h"

namespace mfsdp {
namespace {

// "{identifier}" of `f`, for messages that name another option.
std::string ref(OptionField f) { return std::string("{") + kOptionFieldNames.name(f) + "}"; }

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void require(bool cond, OptionField field, const std::string& text) {
  if (!cond) throw OptionError(field, text);
}

// Replicas and precision: the rules that follow from the placement.
void check_placement(const EngineOptions& o, Placement placement, int replicas) {
  require(replicas >= 1, OptionField::replicas, "must be >= 1, got " + std::to_string(replicas));
  require(replicas == 1 || placement_traits(placement).replicable(), OptionField::replicas,
          "ddp is already fully replicated; use matrixfsdp, fsdp2 or zero1 with " + ref(OptionField::replicas) + " > 1");
  require(replicas == 1 || !o.overlap_backward, OptionField::replicas,
          ref(OptionField::overlap_backward) + " is not supported with " + ref(OptionField::replicas) + " > 1");
  for (auto [dt, field] : {std::pair{o.param_dtype, OptionField::param_dtype}, std::pair{o.reduce_dtype, OptionField::reduce_dtype}})
    require(dt == DType::f32 || dt == DType::bf16, field, std::string("must be f32 or bf16, got ") + dtype_name(dt));
  require(o.matmuls() == DType::f32 || o.matmuls() == DType::bf16, OptionField::param_dtype,
          std::string("matmuls must be f32 or bf16, got ") + dtype_name(o.matmuls()));
  require(!o.expert_parallel || (placement == Placement::matrixfsdp && replicas == 1), OptionField::expert_parallel,
          std::string("needs ") + ref(OptionField::placement) + " matrixfsdp without replicas (got " +
              placement_name(placement) + ", " + std::to_string(replicas) + " replica(s))");
  require(!o.expert_parallel || (o.param_dtype == DType::f32 && o.reduce_dtype == DType::f32), OptionField::expert_parallel,
          "needs f32 " + ref(OptionField::param_dtype) + " and " + ref(OptionField::reduce_dtype));
  require(!o.expert_parallel || (!o.recompute_units && !o.overlap_backward), OptionField::expert_parallel,
          "is not supported with activation recompute or " + ref(OptionField::overlap_backward) + " yet");
  require(o.param_dtype == DType::f32 || !placement_traits(placement).resident, OptionField::param_dtype,
          "bf16 needs a sharded placement (matrixfsdp or fsdp2); " + ref(OptionField::placement) + " " +
              placement_name(placement) + " keeps f32 parameters resident on every rank");
}

// The optimizer's options against each other, the model and the device.
void check_optimizer(const EngineOptions& o, Device device, const ModelFacts& model) {
  require(std::isfinite(o.qk_clip) && o.qk_clip >= 0, OptionField::qk_clip, "must be finite and >= 0, got " + num(o.qk_clip));
  require(o.qk_clip == 0 || model.reports_attention_heads, OptionField::qk_clip, "the model reports no attention heads");
  require(!o.muon.split_heads || model.attention_head_dim > 0, OptionField::muon_split_heads,
          "the model has no attention heads");
  require(!o.overlap_backward || o.grad_clip <= 0, OptionField::overlap_backward,
          "needs " + ref(OptionField::grad_clip) + " = 0 (got " + num(o.grad_clip) +
              "): clipping scales every gradient by the global norm, known only after the whole backward, "
              "so a unit's Muon input is not final when its reduction lands");
  require(o.muon.ns_dtype != NsDType::bf16 || o.muon.orthogonalizer != Orthogonalizer::gram_newton_schulz,
          OptionField::muon_ns_dtype,
          "bf16 is not supported with " + ref(OptionField::muon_orthogonalizer) +
              " = gram_newton_schulz (its Gram-matrix recurrence stays f32): use f32, or newton_schulz5 / polar_express");
  if (device == Device::CPU) return;
  require(o.muon.orthogonalizer == Orthogonalizer::newton_schulz5, OptionField::muon_orthogonalizer,
          std::string(orthogonalizer_name(o.muon.orthogonalizer)) + " runs on the CPU only; " +
              ref(OptionField::device) + " is " + device_name(device) + " (use newton_schulz5)");
  require(o.muon.variant == MuonVariant::muon, OptionField::muon_variant,
          std::string("normuon runs on the CPU only; ") + ref(OptionField::device) + " is " + device_name(device) +
              " (use muon)");
}

}  // namespace

OptionError::OptionError(OptionField field, std::string text)
    : std::invalid_argument(std::string("[resolve] ") + kOptionFieldNames.name(field) + ": " + [&] {
        std::string out;
        for (char c : text)
          if (c != '{' && c != '}') out += c;
        return out;
      }()),
      field_(field), text_(std::move(text)) {}

std::string OptionError::message(const std::function<std::string(OptionField)>& name) const {
  std::string out;
  size_t i = 0;
  while (i < text_.size()) {
    const size_t open = text_.find('{', i);
    const size_t close = open == std::string::npos ? open : text_.find('}', open);
    if (close == std::string::npos) break;
    out += text_.substr(i, open - i);
    const auto f = kOptionFieldNames.find(std::string_view(text_).substr(open + 1, close - open - 1));
    out += f ? name(*f) : text_.substr(open, close - open + 1);
    i = close + 1;
  }
  return out + text_.substr(i);
}

ModelFacts model_facts(const UnitModel& model) {
  return {model.attention_head_dim(), !model.attention_heads().empty(), model.attention_head_size()};
}

PlannerOptions planner_options(const EngineOptions& o, const ModelFacts& model) {
  PlannerOptions p;
  p.ns_steps = o.muon.ns_steps;
  p.split_qkv = o.muon.split_qkv;
  p.orthogonalizer = o.muon.orthogonalizer;
  p.head_dim = o.muon.split_heads ? model.attention_head_dim : 0;
  p.expert_parallel = o.expert_parallel;
  return p;
}

AttentionKernel resolve_attention(std::optional<AttentionKernel> asked, Device device, DType param_dtype, int64_t head_size,
                                  bool cudnn_built) {
  const bool cuda = device == Device::CUDA;
  const bool head_ok = cuda_cudnn::head_dim_supported(head_size);
  if (asked == AttentionKernel::cudnn) {
    require(cuda, OptionField::attention,
            std::string("cudnn needs CUDA; ") + ref(OptionField::device) + " is " + device_name(device) +
                " (use fused or unfused)");
    require(cudnn_built, OptionField::attention,
            "cudnn: this build has no cuDNN attention: run scripts/fetch_cudnn_frontend.sh and reconfigure");
    require(head_ok, OptionField::attention,
            "cudnn takes attention heads of 64 or 128 features; the model's have " +
                (head_size > 0 ? std::to_string(head_size) : std::string("an unknown size")) +
                " (use fused or unfused)");
    return AttentionKernel::cudnn;
  }
  if (asked) return *asked;
  if (!cuda) return AttentionKernel::unfused;
  return cudnn_built && head_ok && param_dtype == DType::bf16 ? AttentionKernel::cudnn : AttentionKernel::fused;
}

ResolvedOptions resolve(const EngineOptions& in, Device device, Placement placement, int replicas,
                        const ModelFacts& model) {
  check_placement(in, placement, replicas);
  check_optimizer(in, device, model);
  require(!in.expert_parallel || device == Device::CPU, OptionField::expert_parallel,
          "runs on the CPU only for now (the MoE op stages its expert exchange on the host); " + ref(OptionField::device) + " is " +
              device_name(device));
  require(!in.prefetch_depth || *in.prefetch_depth >= 0, OptionField::prefetch_depth,
          "must be >= 0 or unset (the device default), got " + std::to_string(in.prefetch_depth.value_or(0)));
  require(in.prefetch_limit_bytes >= 0, OptionField::prefetch_limit_bytes,
          "must be >= 0, got " + std::to_string(in.prefetch_limit_bytes));
  const bool cuda = device == Device::CUDA;
  ResolvedOptions r;
  r.options = in;
  if (in.muon.split_heads) r.options.muon.head_dim = model.attention_head_dim;
  r.traits = placement_traits(placement, replicas > 1);
  const auto fixed = [](bool on) { return on ? Toggle::on : Toggle::off; };
  r.options.prefetch_depth = in.prefetch_depth.value_or(cuda ? 1 : 0);
  r.options.batch_orthogonalize = fixed(toggle_value(in.batch_orthogonalize, true));  // bitwise equal, never slower
  // a replica chain and ddp's all-reduce block whatever the switch says
  r.options.overlap_reduce =
      fixed(toggle_value(in.overlap_reduce, cuda) && replicas == 1 && !r.traits.all_reduce_gradients);
  r.options.attention =
      resolve_attention(in.attention, device, in.matmuls(), model.attention_head_size, cuda_cudnn::built());
  return r;
}

EngineChoices engine_choices(const ProjectionInput& in, const ClusterSpec& cluster) {
  EngineOptions o;
  o.muon.ns_steps = in.ns_steps;
  o.prefetch_depth = in.prefetch_depth;
  o.overlap_reduce = in.overlap_reduce;
  o.batch_orthogonalize = in.batch_orthogonalize;
  const ModelFacts facts;
  const ResolvedOptions r = resolve(o, cluster.gpu() ? Device::CUDA : Device::CPU, in.placement, in.replicas, facts);
  EngineChoices e;
  e.prefetch_depth = r.prefetch_depth();
  e.overlap_reduce = r.overlap_reduce();
  e.batch_orthogonalize = r.batch_orthogonalize();
  e.planner = planner_options(r.options, facts);
  e.planner.round_robin = in.round_robin_owners;
  return e;
}

}  // namespace mfsdp
