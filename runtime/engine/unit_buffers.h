// Where a rank's parameter and gradient bytes live, unit by unit: the owned segment, the gathered
// full unit, and the moves between them (all-gather, release, gradient reduction). Every buffer is
// on the communicator's device; nothing here knows the model family or the optimizer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "planner/shard_plan.h"
#include "planner/placement_traits.h"
#include "runtime/engine/unit_model.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// A parameter of a unit: where its full value lives while the unit is gathered.
struct UnitParam {
  int shard = 0;        ///< index into ShardPlan::shards
  bool direct = false;  ///< true: a view into UnitBuffer::full at `offset`; false: into `unpacked`
  int64_t offset = 0;
  Tensor param;         ///< the tensor bound to the model (its grad() is a view too)
};

/// One FSDP unit's buffers on this rank (f32, on the engine's device; under bf16 mixed precision
/// the collectives move bf16 copies, converted on the way in and out).
struct UnitBuffer {
  int index = 0;
  std::vector<int64_t> counts;     ///< per-rank segment numel (the all_gather_v / reduce_scatter_v counts)
  /// Per-rank leading part of the segment that moves while experts stay with their owners
  /// (UnitLayout::gathered_numel); equal to `counts` in a unit without expert matrices.
  std::vector<int64_t> gathered_counts;
  bool has_experts = false;        ///< some segment has an expert tail (gathered_counts != counts)
  Tensor packed;                   ///< the moved prefixes back to back, while an expert-parallel gather runs
  int64_t total = 0, my_offset = 0, my_count = 0;
  Tensor shard, shard_grad;        ///< this rank's segment and its gradient (persistent)
  Tensor full, full_grad;          ///< the whole unit in comm layout, released when not in use
  Tensor unpacked, unpacked_grad;  ///< parameters whose pieces are not one contiguous run of `full`
  std::vector<UnitParam> params;
  bool any_direct = false;         ///< some parameter is a view into `full` (else `full` only stages)
  bool gathered = false, grads_live = false;
  /// A started (prefetched) gather: under bf16 its wire buffers, and the collective (declared
  /// after them, so it is destroyed, i.e. waited for, before they are freed).
  Tensor wire_send, wire_full;
  DType pending_dtype = DType::f32;
  std::unique_ptr<PendingCollective> pending;
  /// A started gradient reduction (reduce_gradients with overlap): the wire copy it sends (bf16
  /// reduce_dtype), and the collective, destroyed (waited for) before it and before full_grad.
  Tensor reduce_wire;
  std::unique_ptr<PendingCollective> pending_reduce;
};


/// The unit buffers of one rank and the collectives that fill and drain them.
class UnitBuffers {
 public:
  /// Allocates every unit's persistent buffers on comm.device() (transient ones released) and
  /// binds every parameter of `model` to its view. `replicas` (HSDP, traits.replicated) groups
  /// this rank with the ranks of the same shard rank in the other replicas; nullptr otherwise.
  /// `param_dtype` (f32 or bf16) is what gather() moves: bf16 all-gathers bf16-rounded copies
  /// of the f32 segments (half the bytes) and widens them, so the bound parameters hold
  /// bf16-representable values; it needs a non-resident placement (resolve() checks it). `reduce_dtype` (f32 or bf16)
  /// is what reduce_gradients() puts on the wire; owners add the contributions in f32 either way.
  /// Throws std::invalid_argument when the plan and the model disagree, or for a dtype it refuses.
  UnitBuffers(UnitModel& model, Communicator& comm, const ShardPlan& plan, const PlacementTraits& traits,
              Communicator* replicas = nullptr, DType param_dtype = DType::f32, DType reduce_dtype = DType::f32);

  int size() const { return static_cast<int>(units_.size()); }
  UnitBuffer& unit(int u) { return *units_[static_cast<size_t>(u)]; }
  Device device() const { return device_; }

  /// Makes unit u's full parameters available (all_gather_v of the segments in param_dtype, then
  /// unpacking); no-op when already gathered or resident.
  void gather(int u, CommPhase phase) { gather(u, phase, param_dtype_); }
  /// The same in `dtype` (f32: the exact master values, for exports).
  void gather(int u, CommPhase phase, DType dtype);
  /// Starts unit u's gather in param_dtype without waiting for it (Communicator::
  /// start_all_gather_v), unless it is gathered or started already, or the gathered bytes would
  /// pass `limit_bytes` (0 = no limit); gather(u) finishes it. Returns whether u is now gathered
  /// or on its way.
  bool prefetch(int u, CommPhase phase, int64_t limit_bytes);
  /// Bytes of the units gathered or being gathered now (f32 buffers plus bf16 wire copies).
  int64_t gathered_bytes() const;
  /// Frees unit u's gathered bytes (never for resident placements).
  void release(int u);
  /// Materializes and zeroes unit u's full gradient buffers before its backward.
  void ensure_grad_buffers(int u);
  /// Hands unit u's gradients of this micro-batch to the owners (reduce_scatter_v with
  /// ReduceOp::accumulate onto shard_grad) or to every rank (all_reduce, ddp); under HSDP the
  /// owners' running sums are chained through the replicas (reduce_to_owners). Resident
  /// placements only reduce after the last micro-batch; the others free the full gradients after.
  /// `overlap`: start the reduction (Communicator::start_reduce_scatter_v) and return; the full
  /// gradients stay until finish_reduce(u). Without replicas and for owner reductions only
  /// (HSDP's replica chain and ddp's all-reduce complete before returning). Bitwise equal.
  void reduce_gradients(int u, bool last_micro, bool overlap = false);
  /// Waits for unit u's started reduction, if any, then frees its full gradients (non-resident
  /// placements); afterwards its owners' gradient shard is complete. No-op when none is pending.
  void finish_reduce(int u);
  /// Reductions that were still in flight when reduce_gradients returned and were completed by
  /// finish_reduce, since construction: what only the overlapped path does.
  int64_t overlapped_reductions() const { return overlapped_reductions_; }
  /// Zeroes the gradient shards (and resident full gradients) at the start of a step.
  void zero_gradients();
  /// Multiplies every gradient shard by alpha.
  void scale_gradients(float alpha);
  /// Multiplies unit u's gradient shard by alpha (the same f32 products as scale_gradients).
  void scale_unit_gradients(int u, float alpha);
  /// All-gathers every unit's owned segments back into the resident full parameters (zero1).
  void all_gather_updated_params();
  /// Where this rank stores piece `p` of shard `si`'s parameter between steps (a view of its
  /// segment, or of the resident full buffer); undefined when the rank does not store it. After
  /// writing parameters through these views, call finish_load(). Local, no collective.
  Tensor stored_piece(int si, const ShardPiece& p);
  /// Refreshes the unpacked parameter views of resident placements after stored pieces changed.
  void finish_load();
  /// Runs `fn` with every unit gathered in `dtype`, then frees them again (also when fn throws).
  void with_all_gathered(const std::function<void()>& fn, CommPhase phase, DType dtype);
  DType param_dtype() const { return param_dtype_; }
  /// Expert parallelism on (true) or off: while on, gathers move only each segment's leading
  /// part (the expert matrices stay with their owners; an owner's own expert matrices are copied
  /// into its full buffer, the others' slots are not filled), an owner's full gradients of its
  /// experts start from its running gradient shard (the model adds each rank's contribution in
  /// rank order) and go back there at the reduction, which moves only the leading parts. Off,
  /// every gather is whole (exports, sampling). Turn on only with no unit gathered or pending
  /// (std::invalid_argument otherwise); turning off never throws.
  void set_experts_stay(bool on);

 private:
  void build_unit(int ui);
  void unpack_params(UnitBuffer& unit);
  void start_gather(UnitBuffer& unit, CommPhase phase, DType dtype);
  void finish_gather(UnitBuffer& unit);
  int64_t unit_gather_bytes(const UnitBuffer& unit, DType dtype) const;
  void reduce_to_owners(UnitBuffer& unit, bool overlap);
  bool experts_stay(const UnitBuffer& unit) const { return experts_stay_ && unit.has_experts; }
  /// Copies this rank's expert tail between its segment (shard or shard_grad) and its slot of the
  /// full buffer (full or full_grad), `into_full` or back.
  void copy_expert_tail(const Tensor& segment, const Tensor& full, const UnitBuffer& unit, bool into_full);
  /// Moves each rank's leading part between the full buffer and `packed` (back to back).
  void move_prefixes(const Tensor& full, const Tensor& packed, const UnitBuffer& unit, bool to_packed);
  void drop_full_grads(UnitBuffer& unit);
  void all_reduce_gradients(UnitBuffer& unit);
  Tensor buffer(int64_t numel, MemCategory cat, bool materialized) const;

  UnitModel& model_;
  Communicator& comm_;
  Communicator* replicas_;  ///< HSDP replica group, or nullptr
  const ShardPlan& plan_;
  PlacementTraits traits_;
  Device device_;
  DType param_dtype_, reduce_dtype_;
  int rank_;
  bool experts_stay_ = false;
  int64_t overlapped_reductions_ = 0;
  std::vector<std::unique_ptr<UnitBuffer>> units_;
};

}  // namespace mfsdp
