#include "runtime/engine/sharded_engine.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "runtime/autograd.h"
#include "runtime/engine/engine_units.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Exact sum over ranks: every rank's accumulator state is gathered and merged with integer
// additions, so all ranks get the same bits whatever the rank split.
ExactSum all_reduce_exact(Communicator& comm, const ExactSum& local, CommPhase phase) {
  const auto words = local.to_words();
  std::vector<std::array<int64_t, ExactSum::kWords>> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather_host(words.data(), all.data(), sizeof(words), phase);
  ExactSum total;
  for (const auto& w : all) total.merge(ExactSum::from_words(w));
  return total;
}

Tensor released(int64_t numel, MemCategory cat) {  // a buffer whose bytes exist only when needed
  Tensor t = Tensor::empty({numel}, DType::f32, Device::CPU, cat);
  t.storage()->release();
  return t;
}

}  // namespace


ShardedEngine::ShardedEngine(GPT& model, Communicator& comm, const ShardPlan& plan, const EngineOptions& opts)
    : model_(model), comm_(comm), plan_(plan), opts_(opts), rank_(comm.rank()), world_(comm.world_size()) {
  check_arg(plan_.world_size == world_, "ShardedEngine",
            "plan is for world size " + std::to_string(plan_.world_size) + ", communicator has " + std::to_string(world_));
  const auto& inv = model_.inventory();
  check_arg(plan_.shards.size() == inv.params.size() && plan_.units.size() == inv.unit_names.size(), "ShardedEngine",
            "plan has " + std::to_string(plan_.shards.size()) + " parameters in " + std::to_string(plan_.units.size()) +
                " units, model has " + std::to_string(inv.params.size()) + " in " + std::to_string(inv.unit_names.size()));
  for (size_t i = 0; i < inv.params.size(); ++i)
    check_arg(plan_.shards[i].name == inv.params[i].name && plan_.shards[i].shape == inv.params[i].shape &&
                  plan_.shards[i].unit == inv.params[i].unit,
              "ShardedEngine", "plan parameter " + plan_.shards[i].name + shape_str(plan_.shards[i].shape) +
                                   " does not match model parameter " + inv.params[i].name + shape_str(inv.params[i].shape));
  resident_ = plan_.placement == Placement::zero1 || plan_.placement == Placement::ddp;
  build_units();
}

ShardedEngine::~ShardedEngine() = default;

void ShardedEngine::build_units() {
  const bool ddp = plan_.placement == Placement::ddp;
  for (size_t ui = 0; ui < plan_.units.size(); ++ui) {
    units_.push_back(std::make_unique<Unit>());
    Unit* unit = units_.back().get();
    const UnitLayout& L = plan_.units[ui];
    unit->index = static_cast<int>(ui);
    unit->counts = L.segment_numel;
    unit->total = L.total_numel();
    unit->my_offset = ddp ? 0 : L.segment_offset(rank_);
    unit->my_count = ddp ? unit->total : L.segment_numel[rank_];
    if (resident_) {
      unit->full = Tensor::empty({unit->total}, DType::f32, Device::CPU, MemCategory::parameters);
      unit->full.zero();
      unit->shard = unit->full.view(unit->my_offset, {unit->my_count});
      unit->gathered = true;
    } else {
      unit->shard = Tensor::empty({unit->my_count}, DType::f32, Device::CPU, MemCategory::parameters);
      unit->shard.zero();  // fsdp2 padding stays zero
      unit->full = released(unit->total, MemCategory::gathered_params);
    }
    // zero1 and ddp keep full gradients resident and accumulate micro-batches in them; the other
    // placements hold a unit's full gradients only during its backward. ddp all-reduces in place,
    // so its gradient "shard" is the full buffer itself.
    if (resident_) {
      MemCategoryScope s(MemCategory::gradients);
      unit->full_grad = Tensor::zeros({unit->total});
    } else {
      unit->full_grad = released(unit->total, MemCategory::gathered_grads);
    }
    if (ddp) {
      unit->shard_grad = unit->full_grad;
    } else {
      MemCategoryScope s(MemCategory::gradients);
      unit->shard_grad = Tensor::zeros({unit->my_count});
    }

    // Parameter bindings: a direct view when the pieces form one run of the unit buffer.
    int64_t unpacked_total = 0;
    for (int si : plan_.shards_in_unit(unit->index)) {
      const MatrixShard& s = plan_.shards[si];
      Binding b;
      b.shard = si;
      bool contiguous = !s.pieces.empty();
      int64_t expect = -1;
      for (const ShardPiece& p : s.pieces) {
        const int64_t pos = L.segment_offset(p.rank) + p.segment_offset;
        if (expect >= 0 && pos != expect) contiguous = false;
        if (expect < 0) b.offset = pos;
        expect = pos + p.numel;
      }
      b.direct = contiguous;
      unit->any_direct = unit->any_direct || contiguous;
      if (!contiguous) {
        b.offset = unpacked_total;
        unpacked_total += s.numel();
      }
      unit->params.push_back(b);
    }
    MemCategory pcat = resident_ ? MemCategory::parameters : MemCategory::gathered_params;
    unit->unpacked = Tensor::empty({unpacked_total}, DType::f32, Device::CPU, pcat);
    if (!resident_) unit->unpacked.storage()->release();
    if (resident_) {
      MemCategoryScope s(MemCategory::gradients);
      unit->unpacked_grad = Tensor::zeros({unpacked_total});
      unit->grads_live = true;
    } else {
      unit->unpacked_grad = released(unpacked_total, MemCategory::gathered_grads);
    }
    for (Binding& b : unit->params) {
      const MatrixShard& s = plan_.shards[b.shard];
      const Tensor& base = b.direct ? unit->full : unit->unpacked;
      const Tensor& gbase = b.direct ? unit->full_grad : unit->unpacked_grad;
      b.param = base.view(b.offset, s.shape);
      b.param.set_requires_grad(true);
      b.param.set_grad(gbase.view(b.offset, s.shape));
      model_.bind(s.name, b.param);
    }

    // Owned pieces and their optimizer state.
    MemCategoryScope state_scope(MemCategory::optimizer_state);
    for (int si : plan_.shards_in_unit(unit->index)) {
      const MatrixShard& s = plan_.shards[si];
      if (ddp) {
        for (const ShardPiece& p : s.pieces) {
          OwnedPiece o{si, p.segment_offset, p.param_offset, p.numel, {}, {}};
          unit->owned.push_back(o);
        }
      } else {
        const ShardPiece* p = s.piece_on(rank_);
        if (p) unit->owned.push_back(OwnedPiece{si, p->segment_offset, p->param_offset, p->numel, {}, {}});
        else if (plan_.placement == Placement::fsdp2 && s.optimizer == OptimizerKind::muon)
          unit->owned.push_back(OwnedPiece{si, 0, 0, 0, {}, {}});  // joins the step's all-gather
      }
    }
    for (OwnedPiece& o : unit->owned) {
      o.m = Tensor::zeros({o.numel});
      if (plan_.shards[o.shard].optimizer == OptimizerKind::adamw) o.v = Tensor::zeros({o.numel});
    }
  }
}

std::vector<int> ShardedEngine::units_needed_by(int u) const {
  if (u == model_.head_unit() && model_.config().tie_embeddings && u != 0) return {u, 0};
  return {u};
}

void ShardedEngine::unpack_params(Unit& unit) {
  const UnitLayout& L = plan_.units[unit.index];
  for (const Binding& b : unit.params) {
    if (b.direct) continue;
    for (const ShardPiece& p : plan_.shards[b.shard].pieces)
      std::memcpy(unit.unpacked.data_f32() + b.offset + p.param_offset,
                  unit.full.data_f32() + L.segment_offset(p.rank) + p.segment_offset, p.numel * sizeof(float));
  }
}

void ShardedEngine::gather(int u, CommPhase phase) {
  Unit& unit = *units_[u];
  if (unit.gathered) return;
  unit.full.storage()->materialize();
  comm_.all_gather_v(unit.shard.numel() ? unit.shard.data_f32() : nullptr, unit.full.data_f32(), unit.counts,
                     DType::f32, phase);
  unit.unpacked.storage()->materialize();
  unpack_params(unit);
  if (!unit.any_direct) unit.full.storage()->release();  // every parameter now lives in `unpacked`
  unit.gathered = true;
}

void ShardedEngine::release(int u) {
  Unit& unit = *units_[u];
  if (resident_ || !unit.gathered) return;
  unit.full.storage()->release();
  unit.unpacked.storage()->release();
  unit.gathered = false;
}

void ShardedEngine::ensure_grad_buffers(int u) {
  Unit& unit = *units_[u];
  if (unit.grads_live) return;
  if (unit.any_direct) {  // otherwise the comm-layout buffer is only needed at the reduce
    unit.full_grad.storage()->materialize();
    unit.full_grad.zero();
  }
  unit.unpacked_grad.storage()->materialize();
  unit.unpacked_grad.zero();
  unit.grads_live = true;
}

void ShardedEngine::reduce_gradients(int u, bool last_micro) {
  Unit& unit = *units_[u];
  if (resident_ && !last_micro) return;  // zero1/ddp: micro-batches accumulate in the resident full gradients
  const UnitLayout& L = plan_.units[unit.index];
  if (!unit.full_grad.storage()->materialized()) {
    unit.full_grad.storage()->materialize();
    unit.full_grad.zero();
  }
  for (const Binding& b : unit.params) {  // scatter split parameters' gradients to the comm layout
    if (b.direct) continue;
    for (const ShardPiece& p : plan_.shards[b.shard].pieces)
      std::memcpy(unit.full_grad.data_f32() + L.segment_offset(p.rank) + p.segment_offset,
                  unit.unpacked_grad.data_f32() + b.offset + p.param_offset, p.numel * sizeof(float));
  }
  if (!resident_) unit.unpacked_grad.storage()->release();
  if (plan_.placement == Placement::ddp) {
    comm_.all_reduce(unit.full_grad.data_f32(), unit.total, DType::f32, ReduceOp::sum, CommPhase::grad_reduce);
  } else {
    // Every rank's contribution is added onto the owner's running gradient shard in rank order, so
    // each owned element sees the same f32 additions as at world size 1 (micro-batch j = k*W + r).
    comm_.reduce_scatter_v(unit.full_grad.data_f32(), unit.my_count ? unit.shard_grad.data_f32() : nullptr,
                           unit.counts, DType::f32, ReduceOp::accumulate, CommPhase::grad_reduce);
  }
  if (resident_) return;  // resident; zeroed at the start of the next step
  unit.full_grad.storage()->release();
  unit.grads_live = false;
}

// ----------------------------------------------------------------------------------------------
// The step schedule, top to bottom.
// ----------------------------------------------------------------------------------------------
StepStats ShardedEngine::train_step(const std::vector<MicroBatch>& micro, int64_t step) {
  check_arg(!micro.empty(), "train_step", "no micro-batches");
  StepStats st;
  st.step = step;
  const double t_start = now_seconds();
  const int U = static_cast<int>(units_.size()), head = model_.head_unit();
  for (auto& unit : units_) {
    unit->shard_grad.zero();
    if (resident_) {
      unit->full_grad.zero();
      unit->unpacked_grad.zero();
    }
  }
  ExactSum loss_sum;  // exact: the printed loss does not depend on the rank split
  int64_t local_tokens = 0;

  for (size_t k = 0; k < micro.size(); ++k) {
    const MicroBatch& mb = micro[k];
    const bool last_micro = k + 1 == micro.size();
    MemCategoryScope act(MemCategory::activations);
    local_tokens += mb.tokens.numel();
    // forward: gather -> compute -> free, unit by unit (the last unit stays for backward)
    double t0 = now_seconds();
    std::vector<Tensor> out(U), in(U);
    for (int u = 0; u < U; ++u) {
      for (int d : units_needed_by(u)) gather(d, CommPhase::fwd_gather);
      if (u == 0) {
        out[u] = model_.embed(mb.tokens);
      } else {
        in[u] = out[u - 1].detach();
        in[u].set_requires_grad(true);
        out[u] = u == head ? model_.head_loss(in[u], mb.targets) : model_.block(u - 1, in[u]);
      }
      if (u != U - 1)
        for (int d : units_needed_by(u)) release(d);
    }
    loss_sum.add(out[head].item());
    st.t_forward += now_seconds() - t0;

    // backward: gather -> backward -> reduce to owners -> free, in reverse unit order
    Tensor grad;  // d loss / d out[u]; undefined for the scalar loss
    for (int u = U - 1; u >= 0; --u) {
      t0 = now_seconds();
      for (int d : units_needed_by(u)) {
        gather(d, CommPhase::bwd_gather);
        ensure_grad_buffers(d);
      }
      backward(out[u], grad);
      out[u] = Tensor();
      if (u > 0) {
        grad = in[u].grad();
        in[u] = Tensor();
      }
      const double t1 = now_seconds();
      st.t_backward += t1 - t0;
      reduce_gradients(u, last_micro);  // the unit's own gradients are complete now (a tied wte waits for unit 0)
      st.t_reduce += now_seconds() - t1;
      for (int d : units_needed_by(u)) release(d);
    }
  }

  // mean over every rank's micro-batches: sum-reduced gradients / (world x micro-batches)
  const double denom = static_cast<double>(world_) * static_cast<double>(micro.size());
  st.loss = all_reduce_exact(comm_, loss_sum, CommPhase::other).value() / denom;
  st.tokens = static_cast<int64_t>(comm_.all_reduce_scalar(static_cast<double>(local_tokens), ReduceOp::sum, CommPhase::other));
  if (!std::isfinite(st.loss))  // every rank sees the same reduced value, so all throw together
    throw NonFiniteLossError("step " + std::to_string(step) + ": the training loss is " + std::to_string(st.loss) +
                             " (diverged); the optimizer step was skipped");
  for (auto& unit : units_)
    if (unit->my_count) kernels(Device::CPU).scale(unit->shard_grad.data_f32(), static_cast<float>(1.0 / denom), unit->my_count);

  const double t_opt = now_seconds();
  clip_gradients(st);
  optimizer_step(step, st);
  st.t_optimizer = now_seconds() - t_opt;
  st.t_total = now_seconds() - t_start;
  return st;
}

double ShardedEngine::clip_gradients(StepStats& st) {
  // Test-only fault injection: MFSDP_TEST_NAN_GRAD=<tensor> puts a NaN into that tensor's gradient.
  static const char* nan_grad = std::getenv("MFSDP_TEST_NAN_GRAD");
  if (nan_grad)
    for (auto& unit : units_)
      for (const OwnedPiece& o : unit->owned)
        if (o.numel > 0 && plan_.shards[o.shard].name == nan_grad)
          unit->shard_grad.data_f32()[o.shard_offset] = std::numeric_limits<float>::quiet_NaN();
  // The exact sum of squares makes the norm, and so the clip coefficient, the same bits at every
  // world size and placement, however the tail tensors are split.
  ExactSum sumsq;
  for (auto& unit : units_) exact_sum_of_squares_cpu(unit->shard_grad.data_f32(), unit->my_count, sumsq);
  // ddp: every rank holds all gradients; otherwise each rank holds its owned shards
  if (plan_.placement != Placement::ddp) sumsq = all_reduce_exact(comm_, sumsq, CommPhase::other);
  st.grad_norm = std::sqrt(sumsq.value());
  if (!std::isfinite(st.grad_norm)) {
    // Every rank sees the same norm, so all take this path together: name the first tensor (in
    // plan order) whose gradient holds a NaN/Inf on any rank, then stop before the optimizer step.
    int first = static_cast<int>(plan_.shards.size());
    for (auto& unit : units_)
      for (const OwnedPiece& o : unit->owned) {
        const float* g = unit->shard_grad.data_f32() + o.shard_offset;
        for (int64_t i = 0; i < o.numel && o.shard < first; ++i)
          if (!std::isfinite(g[i])) first = o.shard;
      }
    first = static_cast<int>(-comm_.all_reduce_scalar(-static_cast<double>(first), ReduceOp::max, CommPhase::other));
    throw NonFiniteLossError("step " + std::to_string(st.step) + ": the global gradient norm is " +
                             std::to_string(st.grad_norm) + " (first non-finite gradient: " +
                             (first < static_cast<int>(plan_.shards.size()) ? plan_.shards[first].name : "?") +
                             "); the optimizer step was skipped");
  }
  st.clip_coef = clip_coefficient(st.grad_norm, opts_.grad_clip);
  if (st.clip_coef < 1.0)
    for (auto& unit : units_) kernels(Device::CPU).scale(unit->shard_grad.data_f32(), static_cast<float>(st.clip_coef), unit->my_count);
  return st.grad_norm;
}

void ShardedEngine::optimizer_step(int64_t step, StepStats& st) {
  const double mult = opts_.schedule.multiplier(step);
  st.lr_muon = opts_.muon_lr * mult;
  st.lr_adamw = opts_.adamw_lr * mult;
  ++opt_steps_;
  for (auto& unit : units_) {
    for (OwnedPiece& o : unit->owned) {
      const MatrixShard& s = plan_.shards[o.shard];
      float* W = unit->shard.data_f32() + o.shard_offset;
      const float* G = unit->shard_grad.data_f32() + o.shard_offset;
      if (s.optimizer == OptimizerKind::muon) {
        if (plan_.placement == Placement::fsdp2) fsdp2_muon(*unit, o, st.lr_muon);
        else muon_step_cpu(W, G, o.m.data_f32(), s.shape[0], s.shape[1], st.lr_muon, opts_.muon, s.qkv_blocks);
      } else if (o.numel) {
        AdamWOptions a = opts_.adamw;
        if (s.shape.size() < 2) a.weight_decay = 0.0;  // norms and biases are not decayed
        adamw_step_cpu(W, G, o.m.data_f32(), o.v.data_f32(), o.numel, st.lr_adamw, opt_steps_, a);
      }
    }
  }
  if (plan_.placement == Placement::zero1) broadcast_updated_params();
}

// Stock FSDP2 + Muon: momentum on the local rows, all-gather the Muon input, Newton-Schulz on the
// full matrix on every rank, keep the local rows of the update.
void ShardedEngine::fsdp2_muon(Unit& unit, OwnedPiece& o, double lr) {
  const MatrixShard& s = plan_.shards[o.shard];
  const int64_t rows = s.shape[0], cols = s.shape[1];
  const int64_t slot = s.fsdp2_slot_numel(world_);
  MemCategoryScope scope(MemCategory::comm_buffers);
  Tensor send = Tensor::zeros({slot}), full_u = Tensor::empty({slot * world_}), update = Tensor::empty({rows * cols});
  if (o.numel)
    muon_momentum_cpu(unit.shard_grad.data_f32() + o.shard_offset, o.m.data_f32(), send.data_f32(), o.numel, opts_.muon);
  comm_.all_gather(send.data_f32(), full_u.data_f32(), slot, DType::f32, CommPhase::opt_step);
  // the first `rows` rows of the gathered slots are the matrix, in order (padding rows follow)
  const int64_t blocks = detail::muon_block_count(rows, cols, opts_.muon, s.qkv_blocks, "fsdp2_muon");
  const int64_t brows = rows / blocks;
  for (int64_t b = 0; b < blocks; ++b)
    newton_schulz_cpu(full_u.data_f32() + b * brows * cols, update.data_f32() + b * brows * cols, brows, cols,
                      opts_.muon.ns_steps);
  if (!o.numel) return;
  muon_apply_update_cpu(unit.shard.data_f32() + o.shard_offset, update.data_f32() + o.param_offset, o.numel, lr,
                        muon_scale(brows, cols, opts_.muon.scale_rule), opts_.muon.weight_decay);
}

void ShardedEngine::broadcast_updated_params() {
  for (auto& unit : units_) {
    MemCategoryScope s(MemCategory::comm_buffers);
    Tensor mine = unit->shard.clone();
    comm_.all_gather_v(unit->my_count ? mine.data_f32() : nullptr, unit->full.data_f32(), unit->counts, DType::f32,
                       CommPhase::opt_step);
    unpack_params(*unit);
  }
}

// ----------------------------------------------------------------------------------------------

void ShardedEngine::load_full_parameters(const std::map<std::string, std::vector<float>>& full) {
  for (auto& unit : units_) {
    const UnitLayout& L = plan_.units[unit->index];
    for (const Binding& b : unit->params) {
      const MatrixShard& s = plan_.shards[b.shard];
      auto it = full.find(s.name);
      check_arg(it != full.end(), "load_full_parameters", "missing tensor '" + s.name + "'");
      check_arg(static_cast<int64_t>(it->second.size()) == s.numel(), "load_full_parameters",
                s.name + ": expected " + std::to_string(s.numel()) + " elements, got " + std::to_string(it->second.size()));
      for (const ShardPiece& p : s.pieces) {
        const float* src = it->second.data() + p.param_offset;
        if (resident_) std::memcpy(unit->full.data_f32() + L.segment_offset(p.rank) + p.segment_offset, src, p.numel * 4);
        else if (p.rank == rank_) std::memcpy(unit->shard.data_f32() + p.segment_offset, src, p.numel * 4);
      }
    }
    if (resident_) unpack_params(*unit);
    for (OwnedPiece& o : unit->owned) {
      o.m.zero();
      if (o.v.defined()) o.v.zero();
    }
  }
  opt_steps_ = 0;
}

void ShardedEngine::init_parameters(uint64_t seed) {
  std::map<std::string, std::vector<float>> full;
  for (const MatrixShard& s : plan_.shards) {
    std::vector<float> v(s.numel());
    GPT::init_param(model_.config(), model_.inventory().params[&s - plan_.shards.data()], seed, v.data());
    full[s.name] = std::move(v);
  }
  load_full_parameters(full);
}

void ShardedEngine::with_full_model(const std::function<void()>& fn) {
  for (size_t u = 0; u < units_.size(); ++u) gather(static_cast<int>(u), CommPhase::other);
  try {
    fn();
  } catch (...) {
    for (size_t u = 0; u < units_.size(); ++u) release(static_cast<int>(u));
    throw;
  }
  for (size_t u = 0; u < units_.size(); ++u) release(static_cast<int>(u));
}

std::map<std::string, std::vector<float>> ShardedEngine::full_parameters() {
  std::map<std::string, std::vector<float>> out;
  with_full_model([&] {
    for (auto& unit : units_)
      for (const Binding& b : unit->params) out[plan_.shards[b.shard].name] = b.param.to_vector();
  });
  return out;
}

std::pair<double, int64_t> ShardedEngine::eval_loss_sum(const std::vector<MicroBatch>& batches) {
  NoGradGuard no_grad;
  MemCategoryScope act(MemCategory::activations);
  const int U = static_cast<int>(units_.size()), head = model_.head_unit();
  ExactSum loss_sum;
  int64_t tokens = 0;
  for (const MicroBatch& mb : batches) {
    const bool empty = mb.tokens.numel() == 0;  // a rank with no sequences left still joins the gathers
    Tensor x;
    for (int u = 0; u < U; ++u) {
      for (int d : units_needed_by(u)) gather(d, CommPhase::other);  // evaluation traffic: "other"
      if (!empty) {
        if (u == 0) x = model_.embed(mb.tokens);
        else if (u == head) loss_sum.add(model_.head_loss(x, mb.targets, 1.0).item());
        else x = model_.block(u - 1, x);
      }
      for (int d : units_needed_by(u)) release(d);
    }
    tokens += mb.targets.numel();
  }
  const double total = all_reduce_exact(comm_, loss_sum, CommPhase::other).value();
  tokens = static_cast<int64_t>(comm_.all_reduce_scalar(static_cast<double>(tokens), ReduceOp::sum, CommPhase::other));
  return {total, tokens};
}

}  // namespace mfsdp
