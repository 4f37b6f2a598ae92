// ShardPlan: where every parameter lives (owner rank, pieces, per-unit segments) under a placement.
// Pure C++ (no MPI): plans clusters we do not have.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optim/muon_options.h"
#include "runtime/core/name_table.h"
#include "planner/param_spec.h"

namespace mfsdp {

/// How a unit's parameters are laid out across ranks.
enum class Placement : uint8_t { matrixfsdp = 0, fsdp2 = 1, zero1 = 2, ddp = 3 };
/// "matrixfsdp", "fsdp2", "zero1", "ddp": the one list of placement names (configs, command lines).
inline constexpr NameTable<Placement, 4> kPlacementNames{{{{Placement::matrixfsdp, "matrixfsdp"},
                                                          {Placement::fsdp2, "fsdp2"},
                                                          {Placement::zero1, "zero1"},
                                                          {Placement::ddp, "ddp"}}}};
/// "matrixfsdp", "fsdp2", "zero1", "ddp".
const char* placement_name(Placement p);
/// Parses a name written by placement_name; throws std::invalid_argument naming the value otherwise.
Placement parse_placement(const std::string& s);

/// The optimizer that updates a parameter: Muon for role `matrix`, AdamW for everything else.
enum class OptimizerKind : uint8_t { muon = 0, adamw = 1 };
/// "muon", "adamw".
inline constexpr NameTable<OptimizerKind, 2> kOptimizerKindNames{{{{OptimizerKind::muon, "muon"}, {OptimizerKind::adamw, "adamw"}}}};
/// "muon", "adamw".
const char* optimizer_name(OptimizerKind k);
/// Parses a name written by optimizer_name; throws std::invalid_argument otherwise.
OptimizerKind parse_optimizer(const std::string& s);

/// Options of the planner. They change the cost model and the baseline, never the routing.
struct PlannerOptions {
  int ns_steps = 5;          ///< Newton-Schulz iterations in the Muon cost model (>= 0)
  bool split_qkv = false;    ///< cost a fused QKV weight as qkv_blocks NS calls (still one owner)
  bool round_robin = false;  ///< naive baseline: parameter k (inventory order) whole on rank k % N
  /// The polar-factor method whose FLOPs (orthogonalizer_flops) balance the Muon owners.
  Orthogonalizer orthogonalizer = Orthogonalizer::newton_schulz5;
  /// > 0: a split matrix (qkv_blocks > 1) costs rows/head_dim orthogonalizations of head_dim rows
  /// (optimizer.muon.split_heads; the model's n_embd / n_head); 0: no per-head split.
  int64_t head_dim = 0;
  /// Rank -> node (ranks on one node share its links); empty: one node. matrixfsdp / zero1 owners
  /// are then relabeled across nodes so that each unit's owned bytes spread over the nodes: an
  /// owner gather sends a whole matrix from its node, and two large owners on one node load that
  /// node's link in one direction while the other direction idles.
  std::vector<int> node_of_rank;
  /// Expert parallelism (matrixfsdp): the matrices of each routed expert (ParamSpec::expert) get
  /// one owner together, balanced as one item, and sit at the end of that owner's segment of
  /// their unit, so a gather that leaves them out moves one contiguous prefix per rank
  /// (UnitLayout::gathered_numel).
  bool expert_parallel = false;
  bool operator==(const PlannerOptions&) const = default;
};

/// A contiguous run of a parameter's flattened (row-major) elements stored on one rank.
struct ShardPiece {
  int rank = 0;
  int64_t segment_offset = 0;  ///< element offset inside that rank's segment of the unit
  int64_t param_offset = 0;    ///< first element of the parameter covered
  int64_t numel = 0;           ///< > 0
  bool operator==(const ShardPiece&) const = default;
};

/// Per-parameter metadata of a plan.
/// `owner` is the rank holding the whole tensor (its only piece), or -1 when the tensor is split
/// (split tail tensors, fsdp2 with N > 1). Under `ddp` owner is always -1: every rank holds and
/// updates a full replica; the single piece on rank 0 only describes the unit buffer.
/// A rank holds at most one piece of a tensor; pieces are ordered by param_offset and together
/// cover [0, numel) exactly once.
struct MatrixShard {
  std::string name;
  std::vector<int64_t> shape;  ///< logical (global) shape, row-major
  ParamRole role = ParamRole::matrix;
  int unit = 0;
  int qkv_blocks = 1;
  int expert = -1;  ///< ParamSpec::expert
  OptimizerKind optimizer = OptimizerKind::adamw;
  int owner = -1;
  std::vector<ShardPiece> pieces;

  /// Product of the shape (1 for a 0-D scalar).
  int64_t numel() const;
  /// Dim-0 extent: shape[0], or 1 for a 0-D scalar. A 1-D tensor is `rows` rows of 1 element.
  int64_t rows() const;
  /// Elements per dim-0 row: product of shape[1..] (1 for 0-D and 1-D tensors).
  int64_t row_numel() const;
  /// fsdp2: ceil(rows / world) rows reserved per rank. Throws std::invalid_argument if world < 1.
  int64_t fsdp2_rows_per_rank(int world) const;
  /// fsdp2: real rows on `rank`: rows [rank*rpr, min(rows, (rank+1)*rpr)), possibly none.
  int64_t fsdp2_rows_on(int rank, int world) const;
  /// fsdp2: elements `rank` reserves for this tensor in its segment (rpr * row_numel).
  int64_t fsdp2_slot_numel(int world) const;
  /// fsdp2: padding elements of this tensor summed over ranks (rpr*world - rows) * row_numel.
  int64_t fsdp2_padding_numel(int world) const;
  /// The piece on `rank`, or nullptr when that rank holds none of this tensor.
  const ShardPiece* piece_on(int rank) const;
  /// Elements of this tensor held on `rank` (0 when none).
  int64_t numel_on(int rank) const;
  bool operator==(const MatrixShard&) const = default;
};

/// Per-rank segment sizes of one FSDP unit. The unit's global flat buffer is the concatenation of
/// the segments in rank order; segment_numel[r] includes fsdp2 padding.
struct UnitLayout {
  std::string name;
  std::vector<int64_t> segment_numel;  ///< one entry per rank, >= 0

  /// Sum of all segments (elements).
  int64_t total_numel() const;
  /// Per rank, the leading part of its segment that an expert-parallel gather moves (the segment
  /// less its expert matrices); equal to segment_numel without expert parallelism.
  std::vector<int64_t> gathered_numel;
  /// Start of `rank`'s segment in the unit buffer: sum of segment_numel[0..rank).
  /// Throws std::out_of_range when rank is not in [0, world].
  int64_t segment_offset(int rank) const;
  bool operator==(const UnitLayout&) const = default;
};

/// Balance figures of a plan (cost model: planner/cost_model.h).
/// Bytes are f32 (4 bytes per element). Per-rank bytes = parameters + gradients + optimizer state
/// resident between steps:
///   matrixfsdp: owned elements x (12 Muon | 16 AdamW);
///   fsdp2: reserved slots (incl. padding) x 8 (param + grad) + real elements x (4 Muon | 8 AdamW);
///   zero1: all elements x 8 (full params and grads on every rank) + owned state;
///   ddp: all elements x (12 | 16) on every rank.
/// Per-rank FLOPs = Muon Newton-Schulz FLOPs of the matrices the rank orthogonalizes (fsdp2 and ddp:
/// every matrix on every rank, as stock FSDP2-Muon gathers each matrix) + AdamW FLOPs of its
/// owned elements. Unit segment bytes = segment numel x 4.
struct BalanceStats {
  int muon_params = 0;
  int adamw_params = 0;
  int64_t muon_numel = 0;
  int64_t adamw_numel = 0;
  std::vector<double> rank_flops;               ///< per rank, optimizer FLOPs per step
  std::vector<int64_t> rank_bytes;              ///< per rank
  std::vector<int64_t> unit_segment_max_bytes;  ///< per unit, largest segment
  std::vector<double> unit_segment_mean_bytes;  ///< per unit, unit bytes / world
  int64_t empty_segments = 0;                   ///< (unit, rank) pairs whose segment is empty
  int split_tensors = 0;                        ///< tensors with more than one piece
  int64_t padding_numel = 0;                    ///< fsdp2 padding elements over all units and ranks

  double flops_max() const;
  double flops_mean() const;
  /// max / mean, 1 when the mean is 0.
  double flops_ratio() const;
  int64_t bytes_max() const;
  double bytes_mean() const;
  double bytes_ratio() const;
  /// max / mean segment bytes of unit u (1 for an empty unit).
  double unit_ratio(int u) const;
  /// Largest unit_ratio over units (1 when there are no units).
  double worst_unit_ratio() const;
  bool operator==(const BalanceStats&) const = default;
};

/// The complete plan: every parameter's MatrixShard (inventory order), every unit's segments and
/// the balance statistics. Serializable to JSON (checkpoints store it).
struct ShardPlan {
  int world_size = 1;
  Placement placement = Placement::matrixfsdp;
  PlannerOptions options;
  std::vector<MatrixShard> shards;
  std::vector<UnitLayout> units;
  BalanceStats stats;

  /// {"format": "mfsdp.shard_plan", "version": 1, world_size, placement, options, units, shards
  /// (pieces as [rank, segment_offset, param_offset, numel]), stats}.
  nlohmann::json to_json() const;
  /// Inverse of to_json (lossless); validates the result. Throws std::runtime_error naming the
  /// field on a missing/mistyped field, an unknown format/version, or a broken invariant.
  static ShardPlan from_json(const nlohmann::json& j);

  /// The shard called `name`; throws std::out_of_range naming it when unknown. Linear search.
  const MatrixShard& shard(const std::string& name) const;
  /// The shard called `name`, or nullptr.
  const MatrixShard* find(const std::string& name) const;
  /// Indices into `shards` of the unit's parameters, inventory order.
  std::vector<int> shards_in_unit(int unit) const;
  /// Fills every unit's gathered_numel from the pieces: the segment less its expert matrices
  /// under options.expert_parallel, the whole segment otherwise. Throws std::runtime_error when
  /// an expert piece is not in the tail of its segment (a gather could not skip it).
  void set_gathered_numel();
  /// Checks every layout invariant (coverage, non-overlap, segment sizes, owners, routing, the
  /// fsdp2 row rule, whole matrices under matrixfsdp/zero1). Throws std::runtime_error naming the
  /// tensor/unit/rank and the values on the first violation.
  void validate() const;

  bool operator==(const ShardPlan&) const = default;
};

/// Recomputes the balance statistics of a plan from its layout and options (see BalanceStats).
BalanceStats compute_stats(const ShardPlan& plan);

}  // namespace mfsdp
