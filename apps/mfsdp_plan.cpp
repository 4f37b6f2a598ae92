// mfsdp-plan: plan parameter ownership for a model config at any world size (no MPI) and print
// the routing and balance tables, or the ShardPlan as JSON.
//   mfsdp-plan --config configs/gpt2_124m_shakespeare.json --world-size 8 [--placement P] [--json]
// Loads the config with mfsdp-train's schema and checks (bad input exits 2); uses its model,
// sharding.placement and optimizer.muon (ns_steps, split_qkv) values.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mfsdp-plan: plan MatrixFSDP parameter ownership for a config and world size"};
  std::string config_path, placement_arg;
  int world = 1, ns_steps = 5;
  bool json_out = false, split_qkv = false, per_rank = false;
  app.add_option("--config", config_path, "training config (configs/README.md); its model, sharding and "
                                          "optimizer.muon sections are used")
      ->required();
  app.add_option("--world-size", world, "number of ranks to plan for")
      ->required()
      ->check(CLI::Range(1, mfsdp::kMaxPlanWorldSize));
  app.add_option("--placement", placement_arg,
                 "matrixfsdp | fsdp2 | zero1 | ddp (default: sharding.placement, else matrixfsdp)");
  app.add_option("--ns-steps", ns_steps, "Newton-Schulz iterations in the cost model (default: optimizer.muon.ns_steps)")
      ->check(CLI::Range(1, 100));
  app.add_flag("--split-qkv", split_qkv, "cost fused QKV weights as three Newton-Schulz calls "
                                         "(default: optimizer.muon.split_qkv)");
  app.add_flag("--json", json_out, "print the ShardPlan as JSON instead of tables");
  app.add_flag("--per-rank", per_rank, "print the per-rank table (default when world size <= 16)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }

  // The same schema and checks as mfsdp-train: bad input exits 2 naming the file and key.
  ModelSection model;
  Placement placement = Placement::matrixfsdp;
  PlannerOptions opt;
  try {
    const TrainConfig cfg = load_train_config(config_path);
    model = cfg.model;
    if (model.arch == "llama") model.llama().validate();
    else model.gpt().validate();
    placement = placement_arg.empty() ? cfg.sharding.placement : parse_placement(placement_arg);
    opt.ns_steps = app.count("--ns-steps") ? ns_steps : cfg.optim.muon.ns_steps;
    opt.split_qkv = split_qkv || cfg.optim.muon.split_qkv;
    opt.orthogonalizer = cfg.optim.muon.orthogonalizer;
    if (cfg.optim.muon.split_heads) opt.head_dim = model.n_embd / model.n_head;  // as GPT::attention_head_dim
  } catch (const std::exception& e) {
    std::cerr << "mfsdp-plan: " << e.what() << "\n";
    return 2;
  }

  try {
    const ParamInventory inv = model.arch == "llama" ? llama_inventory(model.llama()) : gpt_inventory(model.gpt());

    auto t0 = std::chrono::steady_clock::now();
    const ShardPlan plan = make_plan(inv, world, placement, opt);
    const double plan_ms = ms_since(t0);
    if (json_out) {
      std::cout << plan.to_json().dump() << "\n";
      return 0;
    }
    const bool owner_placement =
        placement == Placement::matrixfsdp || placement == Placement::zero1;
    ShardPlan baseline, fsdp2;
    std::vector<std::pair<std::string, const ShardPlan*>> cols{
        {std::string(placement_name(placement)) + (owner_placement ? " (LPT)" : ""), &plan}};
    if (owner_placement) {
      PlannerOptions rr = opt;
      rr.round_robin = true;
      baseline = make_plan(inv, world, placement, rr);
      cols.emplace_back(std::string(placement_name(placement)) + " (round-robin)", &baseline);
    }
    if (placement != Placement::fsdp2) {
      fsdp2 = make_plan(inv, world, Placement::fsdp2, opt);
      cols.emplace_back("fsdp2", &fsdp2);
    }

    std::printf("config: %s\n", config_path.c_str());
    if (model.arch == "llama") {
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
    std::printf("world size %d, placement %s, ns_steps %d, split_qkv %s; planned in %.2f ms\n\n",
                world, placement_name(placement), ns_steps, split_qkv ? "on" : "off", plan_ms);
    std::printf("Parameters per optimizer\n%s\n", routing_table(plan).c_str());
    std::printf("Balance\n%s", balance_table(cols).c_str());
    if (placement != Placement::fsdp2) {
      const double r = static_cast<double>(plan.stats.bytes_max()) /
                       static_cast<double>(fsdp2.stats.bytes_max());
      std::printf("max bytes per rank vs fsdp2: %s%s\n", format_ratio(r).c_str(),
                  placement == Placement::matrixfsdp ? " (target <= 1.10 at small world sizes)"
                                                     : "");
    }
    std::printf("\nPer-unit segments (%s)\n%s", placement_name(placement),
                unit_table(plan).c_str());
    if (per_rank || world <= 16)
      std::printf("\nPer-rank (%s)\n%s", placement_name(placement), rank_table(plan).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-plan: %s\n", e.what());
    return 1;
  }
}
