// The step schedule, top to bottom, and the engine's whole-model operations (init, load, gather,
// evaluate). Buffers and their collectives live in unit_buffers.cpp, the owner side of the step
// in owner_state.cpp, checkpoint and fingerprint views of the state in engine_state.cpp.
#include "runtime/engine/sharded_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/autograd.h"
#include "runtime/core/clock.h"
#include "runtime/ops.h"
#include "runtime/trace/trace.h"

namespace mfsdp {
namespace {

// Throws std::invalid_argument naming `batch`, the position and the value when an id of the host
// tensor `ids` ([B, T] or flat) lies outside [0, vocab).
void check_ids(const Tensor& ids, int64_t vocab, const std::string& batch, const char* what) {
  check_arg(ids.defined() && ids.dtype() == DType::i32, batch.c_str(),
            std::string(what) + "s must be i32, got " + (ids.defined() ? ids.describe() : std::string("undefined")));
  const int32_t* p = ids.data<int32_t>();
  const int64_t n = ids.numel(), T = ids.dim() == 2 ? ids.size(1) : n;
  for (int64_t i = 0; i < n; ++i)
    if (p[i] < 0 || p[i] >= vocab)
      throw std::invalid_argument("[" + batch + "] " + what + " id " + std::to_string(p[i]) + " at position " +
                                  std::to_string(i) + " (sequence " + std::to_string(T ? i / T : 0) + ", column " +
                                  std::to_string(T ? i % T : 0) + ") is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ") of the model");
}

// A micro-batch checked and placed on the engine's device. The ids (inputs and targets) are
// range-checked on the host against the model's vocabulary, on every device, so a bad id stops
// here, named, instead of reading or writing out of bounds in a CUDA embedding or cross-entropy.
// For CUDA the embedding backward's index is built from the same host tokens, and tokens, targets
// and index go up in one copy (three views of one buffer), so the backward copies nothing back.
MicroBatch prepare_batch(const MicroBatch& mb, Device d, int64_t vocab, const std::string& batch) {
  const Tensor tok = mb.tokens.defined() && mb.tokens.device() != Device::CPU ? mb.tokens.to(Device::CPU) : mb.tokens;
  const Tensor tgt = mb.targets.defined() && mb.targets.device() != Device::CPU ? mb.targets.to(Device::CPU) : mb.targets;
  check_ids(tok, vocab, batch, "input token");
  check_ids(tgt, vocab, batch, "target");
  if (d == Device::CPU) return {tok, tgt, Tensor()};
  const int64_t nt = tok.numel(), ng = tgt.numel();
  std::vector<int32_t> host(static_cast<size_t>(nt + ng));
  if (nt) std::memcpy(host.data(), tok.data_ptr(), static_cast<size_t>(nt) * sizeof(int32_t));
  if (ng) std::memcpy(host.data() + nt, tgt.data_ptr(), static_cast<size_t>(ng) * sizeof(int32_t));
  append_embedding_index(tok.data<int32_t>(), nt, host);
  const int64_t total = static_cast<int64_t>(host.size());
  const Tensor up = tokens_tensor(host, {total}, d);
  return {up.view(0, tok.shape()), up.view(nt, tgt.shape()), up.view(nt + ng, {total - nt - ng})};
}

// The plan, after checking that it is for the communicator's world size.
const ShardPlan& plan_for(const ShardPlan& plan, const Communicator& comm) {
  check_arg(plan.world_size == comm.world_size(), "ShardedEngine",
            "plan is for world size " + std::to_string(plan.world_size) + ", communicator has " +
                std::to_string(comm.world_size()));
  return plan;
}

// What the ranks' step statistics are reduced from: their tokens, summed, and their phase times,
// maxed (the slowest rank sets each phase's pace).
struct StepTotals {
  double tokens = 0;
  PhaseTimes seconds;
};

// One all_gather_host of every rank's totals over `comm`.
StepTotals reduce_step_totals(Communicator& comm, const StepTotals& local) {
  std::vector<StepTotals> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather_host(&local, all.data(), sizeof(local), CommPhase::other);
  StepTotals out;
  for (const StepTotals& r : all) {
    out.tokens += r.tokens;
    for (auto field : {&PhaseTimes::forward, &PhaseTimes::backward, &PhaseTimes::reduce, &PhaseTimes::optimizer,
                       &PhaseTimes::total})
      out.seconds.*field = std::max(out.seconds.*field, r.seconds.*field);
  }
  return out;
}

// One phase of the step on this rank: a span on the timeline's schedule lane (args.unit when
// `unit` >= 0) and, when `seconds` is given, its wall time added there.
class PhaseScope {
 public:
  explicit PhaseScope(const char* name, double* seconds = nullptr, int unit = -1)
      : span_(trace::Lane::schedule, "phase", name,
              [unit] { return unit < 0 ? std::string() : "\"unit\":" + std::to_string(unit); }),
        seconds_(seconds), start_(now_seconds()) {}
  ~PhaseScope() {
    if (seconds_) *seconds_ += now_seconds() - start_;
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  trace::Span span_;
  double* seconds_;
  double start_;
};

// The experts' owners by ParamSpec::expert (from each expert's matrices; the plan keeps them on
// one rank), and the exchange the MoE op reaches them through.
std::vector<int> expert_owners(const ShardPlan& plan) {
  std::vector<int> owner;
  for (const MatrixShard& s : plan.shards) {
    if (s.expert < 0) continue;
    if (owner.size() <= static_cast<size_t>(s.expert)) owner.resize(static_cast<size_t>(s.expert) + 1, -1);
    check_arg(owner[s.expert] < 0 || owner[s.expert] == s.owner, "ShardedEngine",
              "expert_parallel: the matrices of expert " + std::to_string(s.expert) + " have different owners");
    owner[s.expert] = s.owner;
  }
  return owner;
}

ExpertExchange make_exchange(Communicator& comm) {
  ExpertExchange ex;
  ex.rank = comm.rank();
  ex.world = comm.world_size();
  ex.all_gather_counts = [&comm](const std::vector<int64_t>& mine) {
    std::vector<int64_t> all(mine.size() * static_cast<size_t>(comm.world_size()));
    comm.all_gather_host(mine.data(), all.data(), static_cast<int64_t>(mine.size() * sizeof(int64_t)), CommPhase::other);
    return all;
  };
  ex.all_to_all = [&comm](const float* send, const std::vector<int64_t>& sc, float* recv, const std::vector<int64_t>& rc) {
    comm.all_to_all_v(send, sc, recv, rc, DType::f32, CommPhase::experts);
  };
  return ex;
}

}  // namespace

/// Expert parallelism for one step or evaluation: the unit buffers keep experts with their
/// owners and the model routes rows through the exchange; both off again at the end.
class ExpertsStay {
 public:
  explicit ExpertsStay(ShardedEngine& e) : e_(e.opts_.expert_parallel ? &e : nullptr) {
    if (!e_) return;
    e_->units_.set_experts_stay(true);
    e_->model_.set_expert_exchange(&e_->exchange_, e_->expert_owner_);
  }
  ~ExpertsStay() {
    if (!e_) return;
    e_->units_.set_experts_stay(false);
    e_->model_.set_expert_exchange(nullptr, {});
  }
  ExpertsStay(const ExpertsStay&) = delete;
  ExpertsStay& operator=(const ExpertsStay&) = delete;

 private:
  ShardedEngine* e_;
};

ShardedEngine::ShardedEngine(UnitModel& model, Communicator& comm, const ShardPlan& plan, const EngineOptions& opts,
                             Communicator* replicas)
    : model_(model), comm_(comm), plan_(plan_for(plan, comm)),
      resolved_(resolve(opts, comm.device(), plan.placement, replicas ? replicas->world_size() : 1, model_facts(model))),
      rank_(comm.rank()), world_(comm.world_size()), replicas_(traits_.replicated ? replicas : nullptr),
      replica_count_(replicas_ ? replicas_->world_size() : 1),
      units_(model, comm, plan_, traits_, replicas_, opts_.param_dtype, opts_.reduce_dtype),
      owners_(units_, comm, plan_, traits_, opts_) {
  if (opts_.qk_clip > 0) {
    for (const AttentionHead& h : model_.attention_heads()) {
      std::vector<RowScale> rows;
      for (const ParamRows& r : h.qk_rows) {
        const auto it = std::find_if(plan_.shards.begin(), plan_.shards.end(),
                                     [&](const MatrixShard& s) { return s.name == r.param; });
        check_arg(it != plan_.shards.end() && r.first_row >= 0 && r.rows >= 0 && r.first_row + r.rows <= it->shape[0],
                  "ShardedEngine", "qk_clip: attention head rows " + r.param + "[" + std::to_string(r.first_row) +
                                       ", +" + std::to_string(r.rows) + ") are not rows of a model parameter");
        rows.push_back({static_cast<int>(it - plan_.shards.begin()), r.first_row, r.rows, 1.0f});
      }
      qk_heads_.push_back(std::move(rows));
    }
    model_.record_attention_logits(true);
  }
  if (opts_.expert_parallel) {
    check_arg(plan_.options.expert_parallel, "ShardedEngine",
              "expert_parallel needs a plan made with PlannerOptions::expert_parallel (planner_options does it)");
    expert_owner_ = expert_owners(plan_);
    check_arg(!expert_owner_.empty(), "ShardedEngine", "expert_parallel: the model has no routed experts");
    exchange_ = make_exchange(comm_);
  }
}

ShardedEngine::~ShardedEngine() = default;

// ----------------------------------------------------------------------------------------------
// The step schedule.
// ----------------------------------------------------------------------------------------------
StepStats ShardedEngine::train_step(const std::vector<MicroBatch>& micro, int64_t step) {
  check_arg(!micro.empty(), "train_step", "no micro-batches");
  StepStats st;
  st.step = step;
  const double t_start = now_seconds();
  const int64_t orth0 = owners_.orthogonalizations(), copies0 = host_device_copy_bytes(),
                opt_bytes0 = comm_.counters().at(CommPhase::opt_step).bytes_sent,
                overlapped0 = units_.overlapped_reductions();
  units_.zero_gradients();
  const ExpertsStay experts(*this);
  if (opts_.qk_clip > 0) model_.take_attention_logit_maxima();  // drop what forwards outside steps left
  // the step divides the summed gradients by (world x replicas x micro-batches): the global mean
  const double denom = static_cast<double>(world_) * replica_count_ * static_cast<double>(micro.size());

  // 1. forward and backward of every micro-batch; gradients land on their owners as they are made.
  // Every batch is checked and moved to the device first, and the losses stay there until all
  // micro-batches are queued: on CUDA the host never waits inside this loop.
  std::vector<MicroBatch> batches;
  StepTotals totals;
  for (size_t k = 0; k < micro.size(); ++k) {
    batches.push_back(prepare_batch(micro[k], units_.device(), model_.vocab_size(),
                                    "train_step: micro-batch " + std::to_string(k) + " of step " + std::to_string(step)));
    totals.tokens += static_cast<double>(batches.back().tokens.numel());
  }
  std::vector<Tensor> losses;
  for (size_t k = 0; k < batches.size(); ++k)
    losses.push_back(forward_backward(batches[k], k + 1 == batches.size(), static_cast<float>(1.0 / denom), st));

  // 2. the global mean loss (overlap_backward scaled each unit's gradients as they landed)
  {
    PhaseScope phase("loss");
    ExactSum loss_sum;  // exact: the printed loss does not depend on the rank split
    for (const Tensor& l : losses) loss_sum.add(l.item());
    st.loss = sum_over_world(loss_sum).value() / denom;
  }
  if (!std::isfinite(st.loss))  // every rank sees the same reduced value, so all throw together
    throw NonFiniteLossError("step " + std::to_string(step) + ": the training loss is " + std::to_string(st.loss) +
                             " (diverged); the optimizer step was skipped");
  if (!opts_.overlap_backward) units_.scale_gradients(static_cast<float>(1.0 / denom));

  // 3. the owners' step: global norm, clipping, optimizer, QK-Clip (then zero1's gather of the updates)
  const std::vector<RowScale> qk = qk_clip_scales(st);
  {
    PhaseScope phase("optimizer", &st.seconds.optimizer);
    owners_.clip_gradients(st);
    owners_.optimizer_step(step, st, qk);
  }
  st.seconds.total = now_seconds() - t_start;
  st.orthogonalizations = owners_.orthogonalizations() - orth0;
  st.optimizer_step_bytes = comm_.counters().at(CommPhase::opt_step).bytes_sent - opt_bytes0;
  st.host_device_bytes = host_device_copy_bytes() - copies0;
  st.overlapped_reductions = units_.overlapped_reductions() - overlapped0;

  // 4. step statistics reduced once (and once more over HSDP replicas): tokens summed, phase times maxed
  PhaseScope phase("step statistics");
  totals.seconds = st.seconds;
  totals = reduce_step_totals(comm_, totals);
  if (replicas_) totals = reduce_step_totals(*replicas_, totals);
  st.tokens = static_cast<int64_t>(totals.tokens);
  st.seconds = totals.seconds;
  return st;
}

ExactSum ShardedEngine::sum_over_world(const ExactSum& local) {
  ExactSum group = all_reduce_exact(comm_, local, CommPhase::other);
  return replicas_ ? all_reduce_exact(*replicas_, group, CommPhase::other) : group;
}

// QK-Clip: each head's largest logit of the step, the maximum over ranks (exact, so the same at
// every world size), and sqrt(tau / max) for the rows of every head above tau.
std::vector<RowScale> ShardedEngine::qk_clip_scales(StepStats& st) {
  if (opts_.qk_clip <= 0) return {};
  const std::vector<float> mine = model_.take_attention_logit_maxima();
  check_arg(mine.size() == qk_heads_.size(), "train_step",
            "the model reported " + std::to_string(mine.size()) + " attention maxima for " +
                std::to_string(qk_heads_.size()) + " heads");
  std::vector<float> all(mine.size() * static_cast<size_t>(world_));
  comm_.all_gather_host(mine.data(), all.data(), static_cast<int64_t>(mine.size() * sizeof(float)), CommPhase::other);
  if (replicas_) {  // HSDP: the other replicas' maxima too
    std::vector<float> group(mine.size(), -INFINITY);
    for (size_t i = 0; i < all.size(); ++i) group[i % mine.size()] = std::max(group[i % mine.size()], all[i]);
    all.assign(mine.size() * static_cast<size_t>(replica_count_), 0.0f);
    replicas_->all_gather_host(group.data(), all.data(), static_cast<int64_t>(group.size() * sizeof(float)),
                               CommPhase::other);
  }
  std::vector<RowScale> out;
  st.max_attention_logit = -INFINITY;
  for (size_t h = 0; h < mine.size(); ++h) {
    float mx = -INFINITY;
    for (size_t r = 0; r < all.size() / mine.size(); ++r) mx = std::max(mx, all[r * mine.size() + h]);
    st.max_attention_logit = std::max(st.max_attention_logit, static_cast<double>(mx));
    if (!(mx > opts_.qk_clip)) continue;
    ++st.qk_clipped_heads;
    const float factor = static_cast<float>(std::sqrt(opts_.qk_clip / static_cast<double>(mx)));
    for (RowScale r : qk_heads_[h]) {
      r.factor = factor;
      out.push_back(r);
    }
  }
  return out;
}

Tensor ShardedEngine::forward_backward(const MicroBatch& mb, bool last_micro, float grad_scale, StepStats& st) {
  MemCategoryScope act(MemCategory::activations);
  MatmulDTypeScope matmuls(opts_.matmuls());
  AttentionKernelScope attention(resolved_.attention());
  const int U = units_.size();
  // a recomputed unit keeps only its input from the forward (out[u] is in[u + 1]'s storage)
  auto recomputed = [&](int u) { return opts_.recompute_units && u != U - 1; };
  // gather what unit u needs (with gradient buffers in the backward, dir -1), then start the
  // gathers of the next units in pass order while u computes
  auto gather_for = [&](int u, int dir) {
    const CommPhase phase = dir > 0 ? CommPhase::fwd_gather : CommPhase::bwd_gather;
    for (int d : model_.units_needed_by(u)) {
      units_.gather(d, phase);
      if (dir < 0) units_.ensure_grad_buffers(d);
    }
    for (int k = 1; k <= resolved_.prefetch_depth(); ++k)
      if (const int next = u + dir * k; next >= 0 && next < U)
        for (int d : model_.units_needed_by(next)) units_.prefetch(d, phase, opts_.prefetch_limit_bytes);
  };
  auto release_for = [&](int u) {
    for (int d : model_.units_needed_by(u)) units_.release(d);
  };

  // forward: gather -> compute -> free, unit by unit (the last unit stays for backward)
  std::vector<Tensor> out(U), in(U);
  {
    PhaseScope pass("forward", &st.seconds.forward);
    for (int u = 0; u < U; ++u) {
      PhaseScope unit("forward unit", nullptr, u);
      gather_for(u, +1);
      if (u > 0) {
        in[u] = out[u - 1].detach();
        in[u].set_requires_grad(true);
      }
      std::optional<NoGradGuard> no_graph;
      if (recomputed(u)) no_graph.emplace();
      out[u] = model_.forward_unit(u, in[u], mb, 0);
      if (u != U - 1) release_for(u);
    }
  }

  // backward: gather -> backward -> reduce to owners -> free, in reverse unit order
  const Tensor loss = out[U - 1].detach();
  PhaseScope pass("backward");
  Tensor grad;  // d loss / d out[u]; undefined for the scalar loss
  for (int u = U - 1; u >= 0; --u) {
    {
      PhaseScope unit("backward unit", &st.seconds.backward, u);
      gather_for(u, -1);
      if (recomputed(u)) out[u] = model_.forward_unit(u, in[u], mb, 0);  // the same values, now with a graph
      backward(out[u], grad);
      out[u] = Tensor();
      if (u > 0) grad = std::exchange(in[u], Tensor()).grad();
    }
    {
      // u's own gradients are complete (a tied embedding waits for unit 0). With overlap_reduce its
      // reduction runs while unit u-1 computes its backward; u+1's, started one unit ago, ends here.
      PhaseScope reduce("reduce", &st.seconds.reduce, u);
      units_.reduce_gradients(u, last_micro, resolved_.overlap_reduce());
      if (u + 1 < U) units_.finish_reduce(u + 1);
      if (u == 0 || (last_micro && opts_.overlap_backward)) units_.finish_reduce(u);
    }
    if (last_micro && opts_.overlap_backward) {  // u's gradients are final: its Muon updates can start
      PhaseScope orthogonalize("orthogonalize unit", &st.t_overlap, u);
      units_.scale_unit_gradients(u, grad_scale);
      owners_.orthogonalize_unit(u);
    }
    release_for(u);
  }
  return loss;
}

// ----------------------------------------------------------------------------------------------

void ShardedEngine::load_parameters(const std::function<std::vector<float>(const ParamSpec&)>& full_value_of) {
  for (size_t si = 0; si < plan_.shards.size(); ++si) {
    const MatrixShard& s = plan_.shards[si];
    std::vector<float> full;  // asked for only when this rank stores a piece of it
    for (const ShardPiece& p : s.pieces)
      if (Tensor dst = units_.stored_piece(static_cast<int>(si), p); dst.defined()) {
        if (full.empty()) {
          full = full_value_of(model_.inventory().params[si]);
          check_arg(static_cast<int64_t>(full.size()) == s.numel(), "load_parameters",
                    s.name + ": expected " + std::to_string(s.numel()) + " elements, got " + std::to_string(full.size()));
        }
        dst.copy_from_host(full.data() + p.param_offset);
      }
  }
  units_.finish_load();
  owners_.reset();
}

void ShardedEngine::load_full_parameters(const std::map<std::string, std::vector<float>>& full) {
  for (const MatrixShard& s : plan_.shards)
    check_arg(full.count(s.name) > 0, "load_full_parameters", "missing tensor '" + s.name + "'");
  load_parameters([&](const ParamSpec& spec) { return full.at(spec.name); });
}

void ShardedEngine::init_parameters(uint64_t seed) {
  std::vector<float> slice;  // one piece at a time: no rank ever holds a parameter it does not store
  for (size_t si = 0; si < plan_.shards.size(); ++si) {
    const MatrixShard& s = plan_.shards[si];
    const ParamSpec& spec = model_.inventory().params[si];
    for (const ShardPiece& p : s.pieces)
      if (Tensor dst = units_.stored_piece(static_cast<int>(si), p); dst.defined()) {
        slice.resize(static_cast<size_t>(p.numel));
        model_.init_param(spec, seed, p.param_offset, p.numel, slice.data());
        dst.copy_from_host(slice.data());
      }
  }
  units_.finish_load();
  owners_.reset();
}

Tensor ShardedEngine::logits_by_unit(const Tensor& tokens) {
  NoGradGuard no_grad;
  MemCategoryScope act(MemCategory::activations);
  MatmulDTypeScope matmuls(opts_.matmuls());
  AttentionKernelScope attention(resolved_.attention() == AttentionKernel::cudnn ? AttentionKernel::fused
                                                                                : resolved_.attention());
  const ExpertsStay experts(*this);
  const MicroBatch mb = prepare_batch(MicroBatch{tokens, tokens}, units_.device(), model_.vocab_size(), "sample");
  const int U = units_.size();
  Tensor x;
  for (int u = 0; u < U; ++u) {
    for (int d : model_.units_needed_by(u)) units_.gather(d, CommPhase::other);
    try {
      x = u + 1 < U ? model_.forward_unit(u, x, mb, 1.0) : model_.head_logits(x);
    } catch (...) {  // nothing stays gathered (a later f32 gather must not find a compute-dtype copy)
      for (int d : model_.units_needed_by(u)) units_.release(d);
      throw;
    }
    for (int d : model_.units_needed_by(u)) units_.release(d);
  }
  return x;
}

ShardedEngine::ParameterStream::ParameterStream(ShardedEngine& engine) : engine_(engine) {
  for (size_t si = 0; si < engine.plan_.shards.size(); ++si) shard_of_[engine.plan_.shards[si].name] = static_cast<int>(si);
}

ShardedEngine::ParameterStream::~ParameterStream() {
  if (unit_ >= 0) engine_.units_.release(unit_);
}

int ShardedEngine::ParameterStream::gather(const ParamSpec& spec) {
  const auto it = shard_of_.find(spec.name);
  check_arg(it != shard_of_.end(), "ParameterStream", "unknown parameter '" + spec.name + "'");
  const int u = engine_.plan_.shards[it->second].unit;
  if (u != unit_) {
    if (unit_ >= 0) engine_.units_.release(std::exchange(unit_, -1));
    engine_.units_.gather(u, CommPhase::other, DType::f32);  // the f32 master values, whatever the compute dtype
    unit_ = u;
  }
  return it->second;
}

std::vector<float> ShardedEngine::ParameterStream::operator()(const ParamSpec& spec) {
  const int si = gather(spec);
  for (const UnitParam& b : engine_.units_.unit(unit_).params)
    if (b.shard == si) return b.param.to_vector();
  throw std::logic_error("ParameterStream: '" + spec.name + "' is not in its unit");
}

std::map<std::string, std::vector<float>> ShardedEngine::full_parameters() {
  std::map<std::string, std::vector<float>> out;
  units_.with_all_gathered([&] {  // the f32 master values, whatever the compute dtype
    for (int u = 0; u < units_.size(); ++u)
      for (const UnitParam& b : units_.unit(u).params) out[plan_.shards[b.shard].name] = b.param.to_vector();
  }, CommPhase::other, DType::f32);
  return out;
}

std::pair<double, int64_t> ShardedEngine::eval_loss_sum(const std::vector<MicroBatch>& batches) {
  NoGradGuard no_grad;
  MemCategoryScope act(MemCategory::activations);
  MatmulDTypeScope matmuls(opts_.matmuls());
  AttentionKernelScope attention(resolved_.attention());
  const ExpertsStay experts(*this);
  const int U = units_.size();
  ExactSum loss_sum;
  int64_t tokens = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    const MicroBatch& host_mb = batches[b];
    const bool empty = host_mb.tokens.numel() == 0;  // a rank with no sequences left still joins the gathers
    const MicroBatch mb = empty ? host_mb
                                : prepare_batch(host_mb, units_.device(), model_.vocab_size(),
                                                "evaluate: batch " + std::to_string(b));
    Tensor x;
    for (int u = 0; u < U; ++u) {
      for (int d : model_.units_needed_by(u)) units_.gather(d, CommPhase::other);  // evaluation traffic: "other"
      if (!empty) {
        x = model_.forward_unit(u, x, mb, 1.0);
        if (u == U - 1) loss_sum.add(x.item());
      } else {
        model_.forward_unit_without_rows(u);
      }
      for (int d : model_.units_needed_by(u)) units_.release(d);
    }
    tokens += mb.targets.numel();
  }
  const double total = sum_over_world(loss_sum).value();
  tokens = static_cast<int64_t>(comm_.all_reduce_scalar(static_cast<double>(tokens), ReduceOp::sum, CommPhase::other));
  if (replicas_)
    tokens = static_cast<int64_t>(replicas_->all_reduce_scalar(static_cast<double>(tokens), ReduceOp::sum, CommPhase::other));
  return {total, tokens};
}

}  // namespace mfsdp
