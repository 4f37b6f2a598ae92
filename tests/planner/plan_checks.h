// Test helpers for planner tests: small inventories and an independent layout checker.
#pragma once
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "models/gpt_spec.h"
#include "models/model_presets.h"
#include "planner/planner.h"

namespace mfsdp::test {

inline GPTConfig gpt_cfg(int layers, int heads, int width, int seq, int vocab, bool tied = true) {
  GPTConfig c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_embd = width;
  c.seq_len = seq;
  c.vocab_size = vocab;
  c.tie_embeddings = tied;
  return c;
}
inline GPTConfig gpt2_124m() { return model_preset("gpt2-124m").gpt_config(); }
inline GPTConfig gpt2_350m() { return model_preset("gpt2-350m").gpt_config(); }
inline GPTConfig gpt2_774m() { return model_preset("gpt2-774m").gpt_config(); }
inline GPTConfig gpt2_xl() { return model_preset("gpt2-1.5b").gpt_config(); }
inline GPTConfig gpt_tiny(bool tied = true) { return gpt_cfg(2, 2, 32, 16, 65, tied); }

/// Checks the layout rules element by element (use for models up to a few million elements):
/// the plan mirrors the inventory; every element of every tensor is stored exactly once; every
/// element of every segment belongs to exactly one piece except fsdp2 padding, which sits after
/// the real rows of each tensor's slot; matrices are whole under matrixfsdp/zero1 with segments
/// holding matrices before tail pieces.
inline void check_layout_elements(const ShardPlan& plan, const ParamInventory& inv) {
  const int N = plan.world_size;
  REQUIRE(plan.shards.size() == inv.params.size());
  REQUIRE(plan.units.size() == inv.unit_names.size());
  for (size_t i = 0; i < inv.params.size(); ++i) {
    const auto& s = plan.shards[i];
    const auto& p = inv.params[i];
    REQUIRE(s.name == p.name);
    REQUIRE(s.shape == p.shape);
    REQUIRE(s.unit == p.unit);
    REQUIRE((s.optimizer == OptimizerKind::muon) == (p.role == ParamRole::matrix));
  }
  int64_t padding = 0;
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const auto& ul = plan.units[u];
    REQUIRE(ul.name == inv.unit_names[u]);
    REQUIRE(static_cast<int>(ul.segment_numel.size()) == N);
    const int64_t total = ul.total_numel();
    // who[g] = index of the shard stored at global element g of the unit buffer (-1: nobody).
    std::vector<int> who(static_cast<size_t>(total), -1);
    std::vector<int64_t> param_elem(static_cast<size_t>(total), -1);
    int64_t overlaps = 0, misplaced = 0;
    for (size_t i = 0; i < plan.shards.size(); ++i) {
      const auto& s = plan.shards[i];
      if (s.unit != static_cast<int>(u)) continue;
      std::vector<int> hits(static_cast<size_t>(s.numel()), 0);
      for (const auto& pc : s.pieces) {
        REQUIRE(pc.rank >= 0);
        REQUIRE(pc.rank < N);
        REQUIRE(pc.segment_offset >= 0);
        REQUIRE(pc.segment_offset + pc.numel <= ul.segment_numel[pc.rank]);
        const int64_t g0 = ul.segment_offset(pc.rank) + pc.segment_offset;
        for (int64_t e = 0; e < pc.numel; ++e) {
          overlaps += who[g0 + e] != -1;
          who[g0 + e] = static_cast<int>(i);
          param_elem[g0 + e] = pc.param_offset + e;
          hits[pc.param_offset + e] += 1;
        }
      }
      INFO("tensor " << s.name);
      REQUIRE(std::count(hits.begin(), hits.end(), 1) == s.numel());
      const bool whole_matrix = s.optimizer == OptimizerKind::muon &&
                                (plan.placement == Placement::matrixfsdp ||
                                 plan.placement == Placement::zero1);
      if (whole_matrix) {
        REQUIRE(s.pieces.size() == 1);
        REQUIRE(s.owner == s.pieces[0].rank);
      }
      if (plan.placement == Placement::ddp) REQUIRE(s.owner == -1);
    }
    INFO("unit " << ul.name);
    REQUIRE(overlaps == 0);
    const int64_t free_elems = std::count(who.begin(), who.end(), -1);
    if (plan.placement != Placement::fsdp2) {
      REQUIRE(free_elems == 0);
    } else {
      padding += free_elems;
      // Each rank's segment is the tensors' slots in inventory order: real rows, then padding.
      for (int r = 0; r < N; ++r) {
        int64_t g = ul.segment_offset(r);
        for (int i : plan.shards_in_unit(static_cast<int>(u))) {
          const auto& s = plan.shards[i];
          const int64_t real = s.fsdp2_rows_on(r, N) * s.row_numel();
          const int64_t first_row = static_cast<int64_t>(r) * s.fsdp2_rows_per_rank(N);
          for (int64_t e = 0; e < s.fsdp2_slot_numel(N); ++e, ++g) {
            if (e < real)
              misplaced += who[g] != i || param_elem[g] != first_row * s.row_numel() + e;
            else
              misplaced += who[g] != -1;
          }
        }
        REQUIRE(g == ul.segment_offset(r + 1));
      }
    }
    if (plan.placement == Placement::matrixfsdp || plan.placement == Placement::zero1) {
      // Within each segment: all matrices, then all tail pieces (under expert parallelism the
      // expert matrices after them).
      for (int r = 0; r < N; ++r) {
        int order = 0;
        for (int64_t g = ul.segment_offset(r); g < ul.segment_offset(r + 1); ++g) {
          const MatrixShard& s = plan.shards[who[g]];
          const int kind = plan.options.expert_parallel && s.expert >= 0 ? 2 : s.optimizer == OptimizerKind::muon ? 0 : 1;
          misplaced += kind < order;
          order = std::max(order, kind);
        }
      }
    }
    REQUIRE(misplaced == 0);
  }
  REQUIRE(plan.stats.padding_numel == padding);
  REQUIRE_NOTHROW(plan.validate());
}

}  // namespace mfsdp::test
