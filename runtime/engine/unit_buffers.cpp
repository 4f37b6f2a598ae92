#include "runtime/engine/unit_buffers.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "runtime/kernels.h"

namespace mfsdp {

UnitBuffers::UnitBuffers(UnitModel& model, Communicator& comm, const ShardPlan& plan, const PlacementTraits& traits,
                         Communicator* replicas, DType param_dtype, DType reduce_dtype)
    : model_(model), comm_(comm), replicas_(traits.replicated ? replicas : nullptr), plan_(plan), traits_(traits),
      device_(comm.device()), param_dtype_(param_dtype), reduce_dtype_(reduce_dtype), rank_(comm.rank()) {
  check_arg(!traits.replicated || replicas, "ShardedEngine", "a replicated placement needs a replica communicator");
  const auto& inv = model_.inventory();
  check_arg(plan_.shards.size() == inv.params.size() && plan_.units.size() == inv.unit_names.size(), "ShardedEngine",
            "plan has " + std::to_string(plan_.shards.size()) + " parameters in " + std::to_string(plan_.units.size()) +
                " units, model has " + std::to_string(inv.params.size()) + " in " + std::to_string(inv.unit_names.size()));
  for (size_t i = 0; i < inv.params.size(); ++i)
    check_arg(plan_.shards[i].name == inv.params[i].name && plan_.shards[i].shape == inv.params[i].shape &&
                  plan_.shards[i].unit == inv.params[i].unit,
              "ShardedEngine", "plan parameter " + plan_.shards[i].name + shape_str(plan_.shards[i].shape) +
                                   " does not match model parameter " + inv.params[i].name + shape_str(inv.params[i].shape));
  for (size_t ui = 0; ui < plan_.units.size(); ++ui) build_unit(static_cast<int>(ui));
}

// A zeroed buffer on the engine's device, or one whose bytes exist only when needed.
Tensor UnitBuffers::buffer(int64_t numel, MemCategory cat, bool materialized) const {
  Tensor t = Tensor::empty({numel}, DType::f32, device_, cat);
  if (materialized) t.zero();
  else t.storage()->release();
  return t;
}

void UnitBuffers::build_unit(int ui) {
  units_.push_back(std::make_unique<UnitBuffer>());
  UnitBuffer& unit = *units_.back();
  const UnitLayout& L = plan_.units[ui];
  const bool res = traits_.resident, all = traits_.every_rank_updates_all;
  unit.index = ui;
  unit.counts = L.segment_numel;
  unit.gathered_counts = L.gathered_numel.empty() ? L.segment_numel : L.gathered_numel;
  unit.has_experts = unit.gathered_counts != unit.counts;
  unit.total = L.total_numel();
  unit.my_offset = all ? 0 : L.segment_offset(rank_);
  unit.my_count = all ? unit.total : L.segment_numel[rank_];
  // Resident placements keep full parameters and gradients and accumulate micro-batches in them;
  // the others hold a unit's full buffers only while it runs. fsdp2 padding stays zero.
  unit.full = buffer(unit.total, res ? MemCategory::parameters : MemCategory::gathered_params, res);
  unit.shard = res ? unit.full.view(unit.my_offset, {unit.my_count})
                   : buffer(unit.my_count, MemCategory::parameters, true);
  unit.gathered = res;
  unit.full_grad = buffer(unit.total, res ? MemCategory::gradients : MemCategory::gathered_grads, res);
  // ddp all-reduces in place, so its gradient "shard" is the full buffer itself.
  unit.shard_grad = all ? unit.full_grad : buffer(unit.my_count, MemCategory::gradients, true);

  // Parameter bindings: a direct view when the pieces form one run of the unit buffer.
  int64_t unpacked_total = 0;
  for (int si : plan_.shards_in_unit(ui)) {
    const MatrixShard& s = plan_.shards[si];
    UnitParam b;
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
    unit.any_direct = unit.any_direct || contiguous;
    if (!contiguous) {
      b.offset = unpacked_total;
      unpacked_total += s.numel();
    }
    unit.params.push_back(b);
  }
  unit.unpacked = buffer(unpacked_total, res ? MemCategory::parameters : MemCategory::gathered_params, res);
  unit.unpacked_grad = buffer(unpacked_total, res ? MemCategory::gradients : MemCategory::gathered_grads, res);
  unit.grads_live = res;
  for (UnitParam& b : unit.params) {
    const MatrixShard& s = plan_.shards[b.shard];
    const Tensor& base = b.direct ? unit.full : unit.unpacked;
    const Tensor& gbase = b.direct ? unit.full_grad : unit.unpacked_grad;
    b.param = base.view(b.offset, s.shape);
    b.param.set_requires_grad(true);
    b.param.set_grad(gbase.view(b.offset, s.shape));
    model_.bind(s.name, b.param);
  }
}

void UnitBuffers::unpack_params(UnitBuffer& unit) {
  const UnitLayout& L = plan_.units[unit.index];
  for (const UnitParam& b : unit.params) {
    if (b.direct) continue;
    for (const ShardPiece& p : plan_.shards[b.shard].pieces)
      unit.unpacked.view(b.offset + p.param_offset, {p.numel})
          .copy_from(unit.full.view(L.segment_offset(p.rank) + p.segment_offset, {p.numel}));
  }
}

void UnitBuffers::gather(int u, CommPhase phase, DType dtype) {
  UnitBuffer& unit = this->unit(u);
  if (unit.gathered) return;
  if (unit.pending && unit.pending_dtype != dtype) {  // a prefetch in the other dtype: drop it
    finish_gather(unit);
    release(u);
  }
  if (!unit.pending) start_gather(unit, phase, dtype);
  finish_gather(unit);
}

bool UnitBuffers::prefetch(int u, CommPhase phase, int64_t limit_bytes) {
  UnitBuffer& unit = this->unit(u);
  if (unit.gathered || unit.pending) return true;
  if (limit_bytes > 0 && gathered_bytes() + unit_gather_bytes(unit, param_dtype_) > limit_bytes) return false;
  start_gather(unit, phase, param_dtype_);
  return true;
}

// The same number on every rank (prefetch decisions order collectives, so they must agree): the
// f32 unit buffers, plus while a bf16 gather is in flight its wire copies, counted with the largest
// segment as the send part.
int64_t UnitBuffers::unit_gather_bytes(const UnitBuffer& unit, DType dtype) const {
  const int64_t f32 = 4 * (unit.total + unit.unpacked.numel());
  const int64_t largest = unit.counts.empty() ? 0 : *std::max_element(unit.counts.begin(), unit.counts.end());
  return dtype == DType::bf16 ? f32 + 2 * (unit.total + largest) : f32;
}

int64_t UnitBuffers::gathered_bytes() const {
  int64_t sum = 0;
  for (const auto& unit : units_)
    if (!traits_.resident && (unit->gathered || unit->pending))
      sum += unit_gather_bytes(*unit, unit->pending ? unit->pending_dtype : DType::f32);
  return sum;
}

void UnitBuffers::set_experts_stay(bool on) {
  if (on)
    for (const auto& unit : units_)
      check_arg(!unit->pending && (traits_.resident || !unit->gathered), "UnitBuffers::set_experts_stay",
                "unit " + std::to_string(unit->index) + " is gathered or on its way");
  experts_stay_ = on;
}

void UnitBuffers::copy_expert_tail(const Tensor& segment, const Tensor& full, const UnitBuffer& unit, bool into_full) {
  const int64_t lead = unit.gathered_counts[rank_], tail = unit.my_count - lead;
  if (tail == 0) return;
  const Tensor mine = segment.view(lead, {tail}), slot = full.view(unit.my_offset + lead, {tail});
  if (into_full) slot.copy_from(mine);
  else mine.copy_from(slot);
}

void UnitBuffers::move_prefixes(const Tensor& full, const Tensor& packed, const UnitBuffer& unit, bool to_packed) {
  const UnitLayout& L = plan_.units[unit.index];
  int64_t at = 0;
  for (int r = 0; r < comm_.world_size(); ++r) {
    const int64_t n = unit.gathered_counts[r];
    if (n == 0) continue;
    const Tensor a = full.view(L.segment_offset(r), {n}), b = packed.view(at, {n});
    if (to_packed) b.copy_from(a);
    else a.copy_from(b);
    at += n;
  }
}

// bf16: the owned f32 segment rounded to bf16 goes on the wire, widened into `full` at the finish.
// Experts staying with their owners (f32 only, resolve() checks): the leading parts go into
// `packed`, moved into place at the finish.
void UnitBuffers::start_gather(UnitBuffer& unit, CommPhase phase, DType dtype) {
  unit.full.storage()->materialize();
  unit.pending_dtype = dtype;
  if (experts_stay(unit)) {
    MemCategoryScope s(MemCategory::comm_buffers);
    const int64_t moved = std::accumulate(unit.gathered_counts.begin(), unit.gathered_counts.end(), int64_t{0});
    unit.packed = Tensor::empty({moved}, DType::f32, device_);
    const int64_t lead = unit.gathered_counts[rank_];
    unit.pending = comm_.start_all_gather_v(lead ? unit.shard.data_f32() : nullptr, unit.packed.data_f32(),
                                            unit.gathered_counts, DType::f32, phase);
    return;
  }
  if (dtype == DType::bf16) {
    MemCategoryScope s(MemCategory::comm_buffers);
    unit.wire_send = unit.shard.to(DType::bf16);
    unit.wire_full = Tensor::empty({unit.total}, DType::bf16, device_);
    unit.pending = comm_.start_all_gather_v(unit.my_count ? unit.wire_send.data_ptr() : nullptr,
                                            unit.wire_full.data_ptr(), unit.counts, DType::bf16, phase);
  } else {
    unit.pending = comm_.start_all_gather_v(unit.my_count ? unit.shard.data_f32() : nullptr, unit.full.data_f32(),
                                            unit.counts, DType::f32, phase);
  }
}

void UnitBuffers::finish_gather(UnitBuffer& unit) {
  unit.pending->wait();
  unit.pending.reset();
  if (unit.packed.defined()) {
    move_prefixes(unit.full, unit.packed, unit, false);
    copy_expert_tail(unit.shard, unit.full, unit, true);
    unit.packed = Tensor();
  }
  if (unit.pending_dtype == DType::bf16) {
    kernels(device_).convert(unit.wire_full.data_ptr(), DType::bf16, unit.full.data_ptr(), DType::f32, unit.total);
    unit.wire_send = unit.wire_full = Tensor();
  }
  unit.unpacked.storage()->materialize();
  unpack_params(unit);
  if (!unit.any_direct) unit.full.storage()->release();  // every parameter now lives in `unpacked`
  unit.gathered = true;
}

void UnitBuffers::release(int u) {
  UnitBuffer& unit = this->unit(u);
  if (unit.pending) finish_gather(unit);  // a prefetch nobody used: complete it, then drop it
  if (traits_.resident || !unit.gathered) return;
  unit.full.storage()->release();
  unit.unpacked.storage()->release();
  unit.gathered = false;
}

void UnitBuffers::ensure_grad_buffers(int u) {
  finish_reduce(u);
  UnitBuffer& unit = this->unit(u);
  if (unit.grads_live) return;
  if (unit.any_direct) {  // otherwise the comm-layout buffer is only needed at the reduce
    unit.full_grad.storage()->materialize();
    unit.full_grad.zero();
  }
  unit.unpacked_grad.storage()->materialize();
  unit.unpacked_grad.zero();
  if (experts_stay(unit)) copy_expert_tail(unit.shard_grad, unit.full_grad, unit, true);  // the owner's running sums
  unit.grads_live = true;
}

void UnitBuffers::reduce_gradients(int u, bool last_micro, bool overlap) {
  finish_reduce(u);
  UnitBuffer& unit = this->unit(u);
  if (traits_.resident && !last_micro) return;  // micro-batches accumulate in the resident full gradients
  const UnitLayout& L = plan_.units[unit.index];
  if (!unit.full_grad.storage()->materialized()) {
    unit.full_grad.storage()->materialize();
    unit.full_grad.zero();
  }
  for (const UnitParam& b : unit.params) {  // scatter split parameters' gradients to the comm layout
    if (b.direct) continue;
    for (const ShardPiece& p : plan_.shards[b.shard].pieces)
      unit.full_grad.view(L.segment_offset(p.rank) + p.segment_offset, {p.numel})
          .copy_from(unit.unpacked_grad.view(b.offset + p.param_offset, {p.numel}));
  }
  if (!traits_.resident) unit.unpacked_grad.storage()->release();
  if (experts_stay(unit)) copy_expert_tail(unit.shard_grad, unit.full_grad, unit, false);  // summed by the model
  if (traits_.all_reduce_gradients) all_reduce_gradients(unit);
  else reduce_to_owners(unit, overlap);
  if (!unit.pending_reduce) drop_full_grads(unit);
}

void UnitBuffers::finish_reduce(int u) {
  UnitBuffer& unit = this->unit(u);
  if (!unit.pending_reduce) return;
  ++overlapped_reductions_;
  unit.pending_reduce->wait();
  unit.pending_reduce.reset();
  unit.reduce_wire = Tensor();
  drop_full_grads(unit);
}

// After a unit's reduction: non-resident placements free the full gradients (resident ones keep
// them; they are zeroed at the start of the next step).
void UnitBuffers::drop_full_grads(UnitBuffer& unit) {
  if (traits_.resident) return;
  unit.full_grad.storage()->release();
  unit.grads_live = false;
}

// Every rank's contribution is added onto the owner's running gradient shard in rank order, so
// each owned element sees the same f32 additions as at world size 1 (micro-batch j = k*W + r).
// HSDP (world rank g = q*S + s): replica q first takes over replica q-1's running sums, adds its
// S ranks in order, and hands them on to q+1; the last replica's sums are broadcast to all. So the
// additions run in world-rank order 0..W-1, exactly as without replicas at world size W.
// Under reduce_dtype bf16 the contributions travel as bf16 and are added onto the f32 sums.
// `overlap` (no replicas): the reduction is only started; finish_reduce completes it.
void UnitBuffers::reduce_to_owners(UnitBuffer& unit, bool overlap) {
  float* mine = unit.my_count ? unit.shard_grad.data_f32() : nullptr;
  const int q = replicas_ ? replicas_->rank() : 0, R = replicas_ ? replicas_->world_size() : 1;
  if (experts_stay(unit)) {  // only the leading parts; no replicas, f32 (resolve() checks)
    MemCategoryScope s(MemCategory::comm_buffers);
    const int64_t moved = std::accumulate(unit.gathered_counts.begin(), unit.gathered_counts.end(), int64_t{0});
    unit.reduce_wire = Tensor::empty({moved}, DType::f32, device_);
    move_prefixes(unit.full_grad, unit.reduce_wire, unit, true);
    mine = unit.gathered_counts[rank_] ? unit.shard_grad.data_f32() : nullptr;
    if (overlap) {
      unit.pending_reduce = comm_.start_reduce_scatter_v(unit.reduce_wire.data_f32(), mine, unit.gathered_counts,
                                                         DType::f32, ReduceOp::accumulate, CommPhase::grad_reduce);
      return;
    }
    comm_.reduce_scatter_v(unit.reduce_wire.data_f32(), mine, unit.gathered_counts, DType::f32, ReduceOp::accumulate,
                           CommPhase::grad_reduce);
    unit.reduce_wire = Tensor();
    return;
  }
  if (overlap && R == 1) {
    MemCategoryScope s(MemCategory::comm_buffers);
    if (reduce_dtype_ == DType::bf16) unit.reduce_wire = unit.full_grad.to(DType::bf16);
    const Tensor& contrib = reduce_dtype_ == DType::bf16 ? unit.reduce_wire : unit.full_grad;
    unit.pending_reduce = comm_.start_reduce_scatter_v(contrib.data_ptr(), mine, unit.counts, reduce_dtype_,
                                                       ReduceOp::accumulate, CommPhase::grad_reduce);
    return;
  }
  if (q > 0 && unit.my_count)
    replicas_->send_recv({{false, q - 1, mine, unit.my_count, DType::f32}}, CommPhase::grad_reduce);
  {
    MemCategoryScope s(MemCategory::comm_buffers);
    const Tensor contrib = reduce_dtype_ == DType::bf16 ? unit.full_grad.to(DType::bf16) : unit.full_grad;
    comm_.reduce_scatter_v(contrib.data_ptr(), mine, unit.counts, reduce_dtype_, ReduceOp::accumulate,
                           CommPhase::grad_reduce);
  }
  if (R == 1) return;
  if (q + 1 < R && unit.my_count)
    replicas_->send_recv({{true, q + 1, mine, unit.my_count, DType::f32}}, CommPhase::grad_reduce);
  replicas_->broadcast(mine, unit.my_count, DType::f32, R - 1, CommPhase::grad_reduce);
}

// ddp: every rank gets the rank-ordered sum (in bf16 on the wire under reduce_dtype bf16, summed
// in f32 and rounded once).
void UnitBuffers::all_reduce_gradients(UnitBuffer& unit) {
  if (reduce_dtype_ == DType::f32) {
    comm_.all_reduce(unit.full_grad.data_f32(), unit.total, DType::f32, ReduceOp::sum, CommPhase::grad_reduce);
    return;
  }
  MemCategoryScope s(MemCategory::comm_buffers);
  const Tensor wire = unit.full_grad.to(DType::bf16);
  comm_.all_reduce(wire.data_ptr(), unit.total, DType::bf16, ReduceOp::sum, CommPhase::grad_reduce);
  kernels(device_).convert(wire.data_ptr(), DType::bf16, unit.full_grad.data_ptr(), DType::f32, unit.total);
}

void UnitBuffers::zero_gradients() {
  for (int u = 0; u < size(); ++u) finish_reduce(u);
  for (auto& unit : units_) {
    unit->shard_grad.zero();
    if (traits_.resident) {
      unit->full_grad.zero();
      unit->unpacked_grad.zero();
    }
  }
}

void UnitBuffers::scale_gradients(float alpha) {
  for (int u = 0; u < size(); ++u) scale_unit_gradients(u, alpha);
}

void UnitBuffers::scale_unit_gradients(int u, float alpha) {
  finish_reduce(u);
  UnitBuffer& unit = this->unit(u);
  if (unit.my_count) kernels(device_).scale(unit.shard_grad.data_f32(), alpha, unit.my_count);
}

void UnitBuffers::all_gather_updated_params() {
  for (auto& unit : units_) {
    MemCategoryScope s(MemCategory::comm_buffers);
    Tensor mine = unit->shard.clone();
    comm_.all_gather_v(unit->my_count ? mine.data_f32() : nullptr, unit->full.data_f32(), unit->counts, DType::f32,
                       CommPhase::opt_step);
    unpack_params(*unit);
  }
}

Tensor UnitBuffers::stored_piece(int si, const ShardPiece& p) {
  UnitBuffer& unit = this->unit(plan_.shards[si].unit);
  if (traits_.resident)
    return unit.full.view(plan_.units[unit.index].segment_offset(p.rank) + p.segment_offset, {p.numel});
  if (p.rank == rank_) return unit.shard.view(p.segment_offset, {p.numel});
  return Tensor();
}

void UnitBuffers::finish_load() {
  if (traits_.resident)
    for (auto& unit : units_) unpack_params(*unit);
}

void UnitBuffers::with_all_gathered(const std::function<void()>& fn, CommPhase phase, DType dtype) {
  for (int u = 0; u < size(); ++u) gather(u, phase, dtype);
  try {
    fn();
  } catch (...) {
    for (int u = 0; u < size(); ++u) release(u);
    throw;
  }
  for (int u = 0; u < size(); ++u) release(u);
}

}  // namespace mfsdp
