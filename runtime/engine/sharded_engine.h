// The ZeRO-3 sharding engine: FSDP units over a ShardPlan, one explicit step schedule, and the
// optimizer step on owned tensors only, on the communicator's device, for any UnitModel.
// runtime/README.md explains the layers and why training is bitwise identical at every world size.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "planner/shard_plan.h"
#include "runtime/engine/engine_options.h"
#include "runtime/engine/owner_state.h"
#include "planner/placement_traits.h"
#include "runtime/engine/resolve.h"
#include "runtime/engine/unit_buffers.h"
#include "runtime/engine/unit_model.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// planner_options (runtime/engine/resolve.h) for a built model.
inline PlannerOptions planner_options(const EngineOptions& o, const UnitModel& model) {
  return planner_options(o, model_facts(model));
}

/// Trains a UnitModel whose parameters are laid out by a ShardPlan across the communicator's ranks.
///
/// Placements (planner/shard_plan.h):
///  - matrixfsdp: each rank stores its owner segments; forward/backward all-gather a unit
///    (all_gather_v), run it, free it; backward reduce-scatters the unit's gradients to the owners
///    (reduce_scatter_v with ReduceOp::accumulate: rank-ordered additions onto the owner's running
///    gradient shard); owners run Muon on whole matrices and AdamW
///    on their tail pieces. No weight-sized collective between backward and the end of the step.
///  - fsdp2: the same gathers/reductions over even, padded dim-0 shards; at the step each matrix's
///    Muon input is all-gathered (opt_step phase), Newton-Schulz runs on the full matrix on every
///    rank, and each rank updates its own rows (stock FSDP2 + Muon).
///  - zero1 (ZeRO-1): full parameters and full gradients resident on every rank (no gathers);
///    micro-batches accumulate locally, the last one's backward reduce-scatters each unit's
///    gradients to the owners; owners update; updated segments all-gathered back (opt_step phase).
///  - ddp: full replicas; micro-batches accumulate locally, the last one's backward all-reduces each
///    unit's gradients; every rank runs the whole optimizer.
/// Under matrixfsdp/fsdp2 the gradients of each micro-batch are reduced as they are produced and
/// accumulated in the owners' gradient shards (ZeRO-3 memory: no full gradients kept between
/// micro-batches); the step divides by (world size x micro-batches), so the loss is the global mean.
/// Rank r's k-th micro-batch must be global micro-batch j = k*W + r: then the run is bitwise
/// identical to world size 1 with W*A micro-batches (zero1/ddp: for A = 1).
class ShardedEngine {
 public:
  /// Binds every model parameter to the engine's unit buffers, allocated on comm.device() (the
  /// engine's device: every buffer, copy and kernel of the engine is there). Throws
  /// std::invalid_argument when the plan does not match the model (names, shapes) or the
  /// communicator's world size.
  ///
  /// HSDP (replicate x shard): `comm` is this rank's shard group (the plan is for its size S) and
  /// `replicas` groups the R ranks with the same shard rank across replicas (comm/comm_factory.h
  /// make_hsdp_groups); gradients are summed over all R*S ranks in world-rank order, so every
  /// replica stays bitwise equal to world-1 training with R*S*A micro-batches (rank g = q*S + s
  /// feeds global micro-batch k*R*S + g). Throws std::invalid_argument for ddp with R > 1.
  ShardedEngine(UnitModel& model, Communicator& comm, const ShardPlan& plan, const EngineOptions& opts,
                Communicator* replicas = nullptr);
  ~ShardedEngine();
  ShardedEngine(const ShardedEngine&) = delete;
  ShardedEngine& operator=(const ShardedEngine&) = delete;

  /// The model's initialisation (UnitModel::init_param) of the stored pieces: identical values at any world
  /// size and placement for the same seed. Resets optimizer state.
  void init_parameters(uint64_t seed);
  /// Sets every parameter from full_value_of(spec) (its full logical tensor, our layout), asked in
  /// inventory order and only for the parameters this rank stores a piece of, one at a time (a
  /// rank never holds the whole model). Throws naming a mis-sized tensor; exceptions of
  /// `full_value_of` propagate. Local (no collective). Resets optimizer state.
  void load_parameters(const std::function<std::vector<float>(const ParamSpec&)>& full_value_of);
  /// The same from full logical tensors (name -> numel floats). Throws naming the first missing tensor.
  void load_full_parameters(const std::map<std::string, std::vector<float>>& full);
  /// All-gathers every parameter at once: name -> full logical tensor, on every rank: the f32
  /// master values, also under bf16 mixed precision. The whole model on every rank: for tests and
  /// tools on small models; exports stream with ParameterStream.
  std::map<std::string, std::vector<float>> full_parameters();

  /// One optimizer step over this rank's micro-batches (same count on every rank; moved to the
  /// engine's device when they are elsewhere). `step` is the 0-based step index used by the LR
  /// schedule. The returned statistics are reduced over ranks (the same on every rank).
  /// Throws NonFiniteLossError (on every rank) when the global loss or grad norm is not finite.
  StepStats train_step(const std::vector<MicroBatch>& micro, int64_t step);

  /// Forward only: sum of token losses and token count over this rank's batches, summed over all
  /// ranks (every rank passes the same number of batches, possibly with 0 rows). Its gathers are
  /// counted in the `other` phase, not as training traffic.
  std::pair<double, int64_t> eval_loss_sum(const std::vector<MicroBatch>& batches);

  /// Optimizer state as full logical tensors, on every rank (all-gathered from the owners):
  /// m = Muon momentum or AdamW first moment, v = AdamW second moment (AdamW tensors) or, under
  /// variant normuon, NorMuon's per-row second moment of a Muon matrix ([rows] floats), step =
  /// optimizer steps taken (AdamW bias correction). For tests, export and checkpoints.
  struct FullOptimizerState {
    std::map<std::string, std::vector<float>> m, v;
    int64_t step = 0;
  };
  FullOptimizerState full_optimizer_state();

  /// Digest of the whole training state: every parameter, every optimizer-state tensor and the
  /// step counter, in canonical (logical, unsharded) order; 32 lowercase hex digits, the same at
  /// every world size and placement for bitwise-equal state. Computed without gathering: each
  /// rank hashes the elements it owns, keyed by (tensor, kind, logical index, f32 bits), and the
  /// per-tensor 2x64-bit sums are combined by integer addition across ranks (a collective).
  std::string state_fingerprint();

  /// Calls fn(shard, kind, logical offset, numel, data) for every piece of state this rank saves
  /// in a checkpoint: the pieces it owns (under ddp: rank 0 all of them, others none), each with
  /// its parameter values, its m and its v (AdamW: its elements; NorMuon: the rows it covers, as
  /// logical offset = first row and numel = rows). Every element of every tensor is covered by
  /// exactly one rank. Local (no collective).
  using SavedPieceFn = std::function<void(const MatrixShard&, StateKind, int64_t offset, int64_t numel, const float*)>;
  void for_each_saved_piece(const SavedPieceFn& fn);
  /// Fills this rank's state from a reader: read(shard, kind, logical offset, numel, dst) must
  /// write numel f32 values of that logical range. Asks for every parameter range the rank stores
  /// (resident placements: whole tensors) and every optimizer-state range it owns (NorMuon v: all
  /// rows of each Muon matrix it takes part in, in row units); sets the
  /// optimizer step counter to `optimizer_steps`. Local (no collective); exceptions from `read`
  /// propagate.
  using StateReadFn = std::function<void(const MatrixShard&, StateKind, int64_t offset, int64_t numel, float*)>;
  void load_state(const StateReadFn& read, int64_t optimizer_steps);
  /// Optimizer steps taken (AdamW bias correction uses it).
  int64_t optimizer_steps() const { return owners_.steps(); }

  /// Logits [B*T, Vp] (f32, on the engine's device) of tokens i32 [B, T] from a forward that
  /// gathers, runs and frees one FSDP unit at a time (ZeRO-3 memory), in the compute precision.
  /// Collective: every rank calls it with the same shape. Made for sampling, whose forward sees a
  /// new sequence length at every token: where the run resolved cuDNN's attention, which builds
  /// and keeps a plan per shape, the fused kernel runs instead. Gathers count as `other` traffic.
  Tensor logits_by_unit(const Tensor& tokens);

  /// Full parameters one FSDP unit at a time, for exports: operator()(spec) all-gathers the unit
  /// of inventory parameter `spec` in f32 (first releasing the unit the previous call gathered,
  /// if another) and returns its master value; the destructor releases the last unit. Every rank
  /// must ask for the same parameters in the same order (each change of unit is a collective).
  class ParameterStream {
   public:
    explicit ParameterStream(ShardedEngine& engine);
    ~ParameterStream();
    ParameterStream(const ParameterStream&) = delete;
    ParameterStream& operator=(const ParameterStream&) = delete;
    std::vector<float> operator()(const ParamSpec& spec);
    /// The same gathers without the copy (a rank that does not write): returns the shard index.
    int gather(const ParamSpec& spec);

   private:
    ShardedEngine& engine_;
    std::map<std::string, int> shard_of_;
    int unit_ = -1;
  };

  const ShardPlan& plan() const { return plan_; }
  Communicator& comm() { return comm_; }
  UnitModel& model() { return model_; }
  Device device() const { return units_.device(); }
  const EngineOptions& options() const { return opts_; }
  /// The attention kernel forward and backward use (EngineOptions::attention resolved).
  AttentionKernel attention() const { return resolved_.attention(); }
  /// Whether a unit's gradient reduction overlaps the next unit's backward (EngineOptions::overlap_reduce resolved).
  bool overlap_reduce() const { return resolved_.overlap_reduce(); }

 private:
  /// Runs micro-batch `mb` forward and backward unit by unit, reducing each unit's gradients to
  /// the owners as soon as they are complete; returns the micro-batch's loss, a one-element tensor
  /// on the device, not read here (reading it would make the host wait for the forward).
  /// Under overlap_backward the last micro-batch also scales each unit's reduced gradients by
  /// grad_scale and starts its owners' orthogonalization.
  Tensor forward_backward(const MicroBatch& mb, bool last_micro, float grad_scale, StepStats& st);
  /// QK-Clip's row scalings of this step (empty when qk_clip is off or no head exceeds it); fills
  /// st.max_attention_logit and st.qk_clipped_heads. One all_gather_host (phase other).
  std::vector<RowScale> qk_clip_scales(StepStats& st);
  /// Rank r's contributed state pieces in canonical order (unit, then parameter): its owned
  /// pieces; under every_rank_updates_all all pieces on rank 0 and none elsewhere.
  struct StatePiece {
    int shard;
    int64_t param_offset, numel;
  };
  std::vector<StatePiece> state_pieces_of(int r) const;
  /// This rank's owned pieces in the order of state_pieces_of(rank()).
  std::vector<OwnedPiece*> contributed_pieces();
  /// Exact sum of `local` over every rank of every replica.
  ExactSum sum_over_world(const ExactSum& local);


  UnitModel& model_;
  Communicator& comm_;
  ShardPlan plan_;
  ResolvedOptions resolved_;  ///< the options, checked and with the device defaults (resolve())
  const EngineOptions& opts_ = resolved_.options;
  const PlacementTraits& traits_ = resolved_.traits;
  int rank_, world_;
  Communicator* replicas_;  ///< HSDP replica group (R > 1), or nullptr
  int replica_count_;       ///< R (1 without HSDP)
  UnitBuffers units_;
  OwnerState owners_;
  std::vector<std::vector<RowScale>> qk_heads_;  ///< QK-Clip: each model head's rows (factor unset)
  /// Expert parallelism (opts_.expert_parallel): the exchange over comm_ and each expert's owner
  /// (by ParamSpec::expert); ExpertsStay turns both on for a step or an evaluation.
  ExpertExchange exchange_;
  std::vector<int> expert_owner_;
  friend class ExpertsStay;
};

}  // namespace mfsdp
