// mfsdp-plan: plan parameter ownership for a model config at any world size (no MPI) and print
// the routing and balance tables, or the ShardPlan as JSON.
//   mfsdp-plan --config configs/gpt2_124m_shakespeare.json --world-size 8 [--placement P] [--json]
// Loads the config with mfsdp-train's schema and checks (bad input exits 2); uses its model,
// sharding.placement and, through planner_options (the trainer's), optimizer.muon values.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "apps/train/train_config.h"
#include "models/gpt_spec.h"
#include "models/llama_spec.h"
#include "planner/planner.h"
#include "planner/report.h"

namespace {

using nlohmann::json;
using namespace mfsdp;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Args {
  std::string config_path, placement;
  int world = 1, ns_steps = 5, ranks_per_node = 0;
  bool ns_steps_given = false, json_out = false, split_qkv = false, per_rank = false;
};

// What the config says, with the command line's overrides: the model, the placement and the
// planner options the trainer would use (planner_options, runtime/engine/resolve.h).
struct PlanInputs {
  ModelSection model;
  Placement placement = Placement::matrixfsdp;
  PlannerOptions options;
};

// Parses the command line; returns an exit code when it should stop (help: 0, bad input: 2).
std::optional<int> parse_args(int argc, char** argv, Args& a) {
  CLI::App app{"mfsdp-plan: plan MatrixFSDP parameter ownership for a config and world size"};
  app.add_option("--config", a.config_path, "training config (configs/README.md); its model, sharding and "
                                            "optimizer.muon sections are used")
      ->required();
  app.add_option("--world-size", a.world, "number of ranks to plan for")
      ->required()
      ->check(CLI::Range(1, mfsdp::kMaxPlanWorldSize));
  app.add_option("--placement", a.placement, kPlacementNames.list(" | ") + " (default: sharding.placement)");
  app.add_option("--ns-steps", a.ns_steps, "Newton-Schulz iterations in the cost model (default: optimizer.muon.ns_steps)")
      ->check(CLI::Range(1, 100));
  app.add_flag("--split-qkv", a.split_qkv, "cost fused QKV weights as three Newton-Schulz calls "
                                           "(default: optimizer.muon.split_qkv)");
  app.add_option("--ranks-per-node", a.ranks_per_node, "ranks on each node (consecutive ranks share a node; "
                                                      "divides the world size); owners spread over the nodes as "
                                                      "mfsdp-train spreads them (default: one node)")
      ->check(CLI::Range(1, mfsdp::kMaxPlanWorldSize));
  app.add_flag("--json", a.json_out, "print the ShardPlan as JSON instead of tables");
  app.add_flag("--per-rank", a.per_rank, "print the per-rank table (default when world size <= 16)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }
  a.ns_steps_given = app.count("--ns-steps") > 0;
  if (a.ranks_per_node > 0 && a.world % a.ranks_per_node != 0) {
    std::fprintf(stderr, "mfsdp-plan: --ranks-per-node %d does not divide --world-size %d\n", a.ranks_per_node, a.world);
    return 2;
  }
  return std::nullopt;
}

// The same schema and checks as mfsdp-train: throws ConfigError (or the model's check) on bad input.
PlanInputs load_inputs(Args& a) {
  const TrainConfig cfg = load_train_config(a.config_path);
  PlanInputs in;
  in.model = cfg.model;
  (void)in.model.inventory();  // validates the model (throws naming the field)
  in.placement = a.placement.empty() ? cfg.sharding.placement : kPlacementNames.parse(a.placement, "placement");
  in.options = planner_options(cfg.optim, cfg.model.facts());
  if (a.ns_steps_given) in.options.ns_steps = a.ns_steps;
  in.options.split_qkv = in.options.split_qkv || a.split_qkv;
  a.ns_steps = in.options.ns_steps;
  a.split_qkv = in.options.split_qkv;
  if (a.ranks_per_node > 0 && a.ranks_per_node < a.world)
    for (int r = 0; r < a.world; ++r) in.options.node_of_rank.push_back(r / a.ranks_per_node);
  return in;
}

void print_model(const ModelSection& model) {
  if (model.arch == "qwen2_moe") {
    const MoeConfig m = model.moe();
    std::printf("model: MoE, %d layers, %d heads (%d key/value), width %d, %d experts of SwiGLU %d (top %d), shared "
                "expert %d, context %d, vocab %d (padded %lld), %s parameters (%s active)\n",
                m.n_layer, m.n_head, m.n_kv_head, m.n_embd, m.num_experts, m.moe_intermediate_size,
                m.num_experts_per_tok, m.shared_expert_intermediate_size, m.seq_len, m.vocab_size,
                static_cast<long long>(m.padded_vocab_size()), format_count(m.num_params()).c_str(),
                format_count(m.num_active_params()).c_str());
  } else if (model.arch == "llama") {
    const LlamaConfig l = model.llama();
    std::printf("model: Llama, %d layers, %d heads (%d key/value), width %d, SwiGLU %d, context %d, vocab %d "
                "(padded %lld), %s embeddings, %s parameters\n",
                l.n_layer, l.n_head, l.n_kv_head, l.n_embd, l.intermediate_size, l.seq_len, l.vocab_size,
                static_cast<long long>(l.padded_vocab_size()), l.tie_embeddings ? "tied" : "untied",
                format_count(l.num_params()).c_str());
  } else {
    const GPTConfig g = model.gpt();
    std::printf("model: GPT-2, %d layers, %d heads, width %d, context %d, vocab %d (padded %lld), "
                "%s embeddings, %s parameters\n",
                g.n_layer, g.n_head, g.n_embd, g.seq_len, g.vocab_size, static_cast<long long>(g.padded_vocab_size()),
                g.tie_embeddings ? "tied" : "untied", format_count(g.num_params()).c_str());
  }
}

// Each unit's bytes per node (what its gather sends over each node's link): the worst unit's
// max/mean, and the mean over units.
void print_node_balance(const ShardPlan& plan) {
  const std::vector<int>& node = plan.options.node_of_rank;
  const int nodes = *std::max_element(node.begin(), node.end()) + 1;
  double worst = 0, sum = 0;
  int counted = 0;
  for (const UnitLayout& u : plan.units) {
    std::vector<double> on(static_cast<size_t>(nodes), 0.0);
    double total = 0;
    for (int r = 0; r < plan.world_size; ++r) {
      on[static_cast<size_t>(node[r])] += static_cast<double>(u.segment_numel[r]);
      total += static_cast<double>(u.segment_numel[r]);
    }
    if (total == 0) continue;
    const double ratio = *std::max_element(on.begin(), on.end()) / (total / nodes);
    worst = std::max(worst, ratio), sum += ratio, ++counted;
  }
  std::printf("unit bytes per node (%d nodes of %d ranks) max/mean: worst unit %s, mean of units %s\n", nodes,
              plan.world_size / nodes, format_ratio(worst).c_str(), format_ratio(counted ? sum / counted : 0).c_str());
}

// The routing, balance (against round-robin owners and fsdp2), per-unit and per-rank tables.
void print_tables(const Args& a, const PlanInputs& in, const ParamInventory& inv, const ShardPlan& plan,
                  double plan_ms) {
  const Placement placement = in.placement;
  const bool owner_placement = placement == Placement::matrixfsdp || placement == Placement::zero1;
  ShardPlan baseline, fsdp2;
  const bool ep = in.options.expert_parallel;
  std::vector<std::pair<std::string, const ShardPlan*>> cols{
      {std::string(placement_name(placement)) + (owner_placement ? (ep ? " (LPT, whole experts)" : " (LPT)") : ""), &plan}};
  PlannerOptions others = in.options;  // the baselines split experts as they always do
  others.expert_parallel = false;
  if (owner_placement) {
    PlannerOptions rr = others;
    rr.round_robin = true;
    baseline = make_plan(inv, a.world, placement, rr);
    cols.emplace_back(std::string(placement_name(placement)) + " (round-robin)", &baseline);
  }
  if (placement != Placement::fsdp2) {
    fsdp2 = make_plan(inv, a.world, Placement::fsdp2, others);
    cols.emplace_back("fsdp2", &fsdp2);
  }
  std::printf("config: %s\n", a.config_path.c_str());
  print_model(in.model);
  std::printf("world size %d, placement %s, ns_steps %d, split_qkv %s; planned in %.2f ms\n\n", a.world,
              placement_name(placement), a.ns_steps, a.split_qkv ? "on" : "off", plan_ms);
  std::printf("Parameters per optimizer\n%s\n", routing_table(plan).c_str());
  std::printf("Balance\n%s", balance_table(cols).c_str());
  if (placement != Placement::fsdp2) {
    const double r = static_cast<double>(plan.stats.bytes_max()) / static_cast<double>(fsdp2.stats.bytes_max());
    std::printf("max bytes per rank vs fsdp2: %s%s\n", format_ratio(r).c_str(),
                placement == Placement::matrixfsdp ? " (target <= 1.10 at small world sizes)" : "");
  }
  std::printf("\nPer-unit segments (%s)\n%s", placement_name(placement), unit_table(plan).c_str());
  if (!in.options.node_of_rank.empty()) print_node_balance(plan);
  if (a.per_rank || a.world <= 16) {
    std::printf("\nPer-rank (%s)\n%s", placement_name(placement), rank_table(plan).c_str());
    if (const std::string experts = expert_table(plan); !experts.empty())
      std::printf("\nExperts per rank (%s)\n%s", placement_name(placement), experts.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const auto rc = parse_args(argc, argv, a)) return *rc;
  PlanInputs in;
  try {  // bad input exits 2 naming the file and key
    in = load_inputs(a);
  } catch (const std::exception& e) {
    std::cerr << "mfsdp-plan: " << e.what() << "\n";
    return 2;
  }
  try {
    const ParamInventory inv = in.model.inventory();
    const auto t0 = std::chrono::steady_clock::now();
    const ShardPlan plan = make_plan(inv, a.world, in.placement, in.options);
    const double plan_ms = ms_since(t0);
    if (a.json_out) std::cout << plan.to_json().dump() << "\n";
    else print_tables(a, in, inv, plan, plan_ms);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-plan: %s\n", e.what());
    return 1;
  }
}
