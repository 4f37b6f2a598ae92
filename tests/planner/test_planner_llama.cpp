// Plans for a Llama inventory: grouped-query attention's rectangular k/v matrices, SwiGLU's three
// matrices, untied head, no biases.
#include <catch2/catch.hpp>
#include <numeric>

#include "models/llama_spec.h"
#include "tests/planner/plan_checks.h"

using namespace mfsdp;
using namespace mfsdp::test;

namespace {

LlamaConfig llama_tiny() {
  return LlamaConfig{.n_layer = 2, .n_head = 8, .n_kv_head = 2, .n_embd = 64, .intermediate_size = 176, .seq_len = 32,
                     .vocab_size = 100};
}

}  // namespace

TEST_CASE("Llama: routing by role, rectangular GQA matrices costed by min/max side", "[llama]") {
  const LlamaConfig cfg = llama_tiny();
  const int64_t C = 64, KV = 16, I = 176, L = 2;
  const ParamInventory inv = llama_inventory(cfg);
  const ShardPlan plan = make_plan(inv, 4, Placement::matrixfsdp);
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
    REQUIRE(plan.shard(std::string("model.layers.1.self_attn.") + m + ".weight").optimizer == OptimizerKind::muon);
  for (const char* m : {"gate_proj", "up_proj", "down_proj"})
    REQUIRE(plan.shard(std::string("model.layers.0.mlp.") + m + ".weight").optimizer == OptimizerKind::muon);
  for (const char* a : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                        "model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"})
    REQUIRE(plan.shard(a).optimizer == OptimizerKind::adamw);
  REQUIRE(plan.shard("model.layers.0.self_attn.k_proj.weight").shape == std::vector<int64_t>{KV, C});
  REQUIRE(plan.stats.muon_params == 7 * L);
  REQUIRE(plan.stats.muon_numel == L * (2 * C * C + 2 * KV * C + 3 * I * C));
  REQUIRE(plan.stats.muon_numel + plan.stats.adamw_numel == cfg.num_params());

  // k/v [16, 64]: 5 * (4 * 16^2 * 64 + 2 * 16^3), not the cost of a square 64 x 64 matrix.
  REQUIRE(muon_flops(KV, C, 5) == 5.0 * (4.0 * 16 * 16 * 64 + 2.0 * 16 * 16 * 16));
  const double muon_total =
      L * (2 * muon_flops(C, C, 5) + 2 * muon_flops(KV, C, 5) + 2 * muon_flops(I, C, 5) + muon_flops(C, I, 5));
  const double total = std::accumulate(plan.stats.rank_flops.begin(), plan.stats.rank_flops.end(), 0.0);
  REQUIRE(total == Approx(muon_total + adamw_flops(plan.stats.adamw_numel)).epsilon(1e-12));

  for (int world : {1, 2, 3, 5, 8, 16})
    for (Placement p : {Placement::matrixfsdp, Placement::fsdp2, Placement::zero1}) {
      INFO("world " << world << " placement " << placement_name(p));
      check_layout_elements(make_plan(inv, world, p), inv);
    }
}

TEST_CASE("Llama-2 7B inventory: parameter count and units", "[llama]") {
  const LlamaConfig c{.n_layer = 32, .n_head = 32, .n_kv_head = 32, .n_embd = 4096, .intermediate_size = 11008,
                      .seq_len = 4096, .vocab_size = 32000};
  REQUIRE(c.num_params() == 6738415616LL);  // Llama-2 7B
  const ParamInventory inv = llama_inventory(c);
  REQUIRE(inv.unit_names.size() == 34);
  const ShardPlan plan = make_plan(inv, 8, Placement::matrixfsdp);
  REQUIRE(plan.stats.muon_params == 224);
  REQUIRE(plan.stats.flops_ratio() < 1.05);
}
