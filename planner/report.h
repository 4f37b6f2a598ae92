// Text reports of ShardPlans (the tables mfsdp-plan prints).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/shard_plan.h"

namespace mfsdp {

/// A text table with aligned columns: the first column left-aligned, the others right-aligned.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);
  /// Adds a row; throws std::invalid_argument when it has a different number of cells than the
  /// header.
  void add_row(std::vector<std::string> cells);
  /// The table: header, a rule of dashes, the rows; lines end with '\n'.
  std::string str() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

/// 1234567 -> "1,234,567".
std::string format_count(int64_t n);
/// FLOPs in decimal units with 2 decimals: "1.52 TFLOP".
std::string format_flops(double flops);
/// A ratio with 3 decimals: "1.042".
std::string format_ratio(double r);

/// Parameters routed to each optimizer: optimizer | tensors | elements | share.
std::string routing_table(const ShardPlan& plan);
/// Balance figures of several plans side by side (one column per (label, plan)): per-rank
/// optimizer FLOPs and bytes (max, mean, max/mean), per-unit segment max/mean (worst and mean over
/// units), empty segments, split tensors, fsdp2 padding. Throws std::invalid_argument when empty.
std::string balance_table(const std::vector<std::pair<std::string, const ShardPlan*>>& columns);
/// One row per unit: unit | tensors | bytes | segment max | segment mean | max/mean | empty.
std::string unit_table(const ShardPlan& plan);
/// One row per rank: rank | matrices | tail tensors | elements | optimizer FLOPs | bytes.
std::string rank_table(const ShardPlan& plan);
/// Mixture-of-Experts plans (parameters named `model.layers.<l>.mlp.experts.<e>.<m>_proj.weight`):
/// one row per rank with the routed expert matrices it owns (owner = the rank of each matrix's
/// whole-matrix owner, or of its first piece): rank | expert matrices | whole experts, then a line
/// per rank listing "<l>.<e>" for an expert whose gate, up and down matrices are all on the rank
/// and "<l>.<e>:<g|u|d...>" for the matrices of a split one. "" when the plan has no experts.
std::string expert_table(const ShardPlan& plan);

}  // namespace mfsdp
