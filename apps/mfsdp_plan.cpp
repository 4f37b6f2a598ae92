// mfsdp-plan: plan parameter ownership for a model config at any world size (no MPI) and print
// the routing and balance tables, or the ShardPlan as JSON.
//   mfsdp-plan --config configs/gpt2_124m_shakespeare.json --world-size 8 [--placement P] [--json]
// Reads only the config's `model` and `sharding` sections.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "models/gpt_spec.h"
#include "planner/planner.h"
#include "planner/report.h"

namespace {

using nlohmann::json;
using namespace mfsdp;

[[noreturn]] void config_fail(const std::string& file, const std::string& field,
                              const std::string& why) {
  throw std::runtime_error(file + ": field '" + field + "': " + why);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the config file");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
}

GPTConfig read_model(const json& cfg, const std::string& file) {
  if (!cfg.contains("model")) config_fail(file, "model", "missing section");
  const json& m = cfg["model"];
  if (!m.is_object()) config_fail(file, "model", "must be an object");
  GPTConfig g;
  auto get_int = [&](const char* key, int& out) {
    if (!m.contains(key)) config_fail(file, std::string("model.") + key, "missing");
    if (!m[key].is_number_integer())
      config_fail(file, std::string("model.") + key, "must be an integer, got " + m[key].dump());
    out = m[key].get<int>();
  };
  get_int("n_layer", g.n_layer);
  get_int("n_head", g.n_head);
  get_int("n_embd", g.n_embd);
  get_int("seq_len", g.seq_len);
  get_int("vocab_size", g.vocab_size);
  if (m.contains("tie_embeddings")) {
    if (!m["tie_embeddings"].is_boolean())
      config_fail(file, "model.tie_embeddings", "must be true or false, got " +
                                                     m["tie_embeddings"].dump());
    g.tie_embeddings = m["tie_embeddings"].get<bool>();
  }
  try {
    g.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(file + ": " + e.what());
  }
  return g;
}

Placement read_placement(const json& cfg, const std::string& file) {
  if (!cfg.contains("sharding")) return Placement::matrixfsdp;
  const json& s = cfg["sharding"];
  if (!s.is_object()) config_fail(file, "sharding", "must be an object");
  if (!s.contains("placement")) return Placement::matrixfsdp;
  if (!s["placement"].is_string())
    config_fail(file, "sharding.placement", "must be a string, got " + s["placement"].dump());
  try {
    return parse_placement(s["placement"].get<std::string>());
  } catch (const std::invalid_argument& e) {
    config_fail(file, "sharding.placement", e.what());
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mfsdp-plan: plan MatrixFSDP parameter ownership for a config and world size"};
  std::string config_path, placement_arg;
  int world = 1, ns_steps = 5;
  bool json_out = false, split_qkv = false, per_rank = false;
  app.add_option("--config", config_path, "JSON config (its model and sharding sections)")
      ->required();
  app.add_option("--world-size", world, "number of ranks to plan for")
      ->required()
      ->check(CLI::Range(1, mfsdp::kMaxPlanWorldSize));
  app.add_option("--placement", placement_arg,
                 "matrixfsdp | fsdp2 | zero1 | ddp (default: sharding.placement, else matrixfsdp)");
  app.add_option("--ns-steps", ns_steps, "Newton-Schulz iterations in the cost model")
      ->check(CLI::Range(0, 1000));
  app.add_flag("--split-qkv", split_qkv, "cost fused QKV weights as three Newton-Schulz calls");
  app.add_flag("--json", json_out, "print the ShardPlan as JSON instead of tables");
  app.add_flag("--per-rank", per_rank, "print the per-rank table (default when world size <= 16)");
  CLI11_PARSE(app, argc, argv);

  try {
    const json cfg = read_json_file(config_path);
    const GPTConfig model = read_model(cfg, config_path);
    Placement placement = read_placement(cfg, config_path);
    if (!placement_arg.empty()) placement = parse_placement(placement_arg);
    const ParamInventory inv = gpt_inventory(model);
    PlannerOptions opt;
    opt.ns_steps = ns_steps;
    opt.split_qkv = split_qkv;

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
    std::printf("model: GPT-2, %d layers, %d heads, width %d, context %d, vocab %d (padded %lld), "
                "%s embeddings, %s parameters\n",
                model.n_layer, model.n_head, model.n_embd, model.seq_len, model.vocab_size,
                static_cast<long long>(model.padded_vocab_size()),
                model.tie_embeddings ? "tied" : "untied",
                format_count(model.num_params()).c_str());
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
