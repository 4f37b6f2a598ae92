// mfsdp-bench: placements x model presets x Newton-Schulz steps, measured side by side in one MPI
// job after warm-up: per-phase median times, bytes per phase, peak memory per rank; a table, the
// headline ratios fsdp2 / matrixfsdp (optimizer step and whole step) and optional JSON.
//   mpirun -np 4 --oversubscribe mfsdp-bench [--models gpt2-124m] [--ns-steps 5 2] [--json out.json]
// Defaults are sized for a 2-core machine (GPT-2 124M, B=1, T=64, 1 warm-up + 2 measured steps).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>

#include "apps/bench/bench_report.h"
#include "apps/cli_common.h"
#include "comm/comm_factory.h"
#include "comm/node_topology.h"
#include "planner/placement_traits.h"
#include "runtime/engine/engine_options.h"
#include "runtime/core/cpu_affinity.h"
#include "runtime/kernels.h"

using namespace mfsdp;

namespace {

/// The command line: the sweep (models x NS steps x placements) and what every case shares.
struct BenchArgs {
  std::vector<std::string> models{"gpt2-124m"}, placements = kPlacementNames.names();
  std::vector<int> ns_steps{5, 2};
  BenchCase base;
  int layers = 0;
  int64_t vocab = 0;  ///< 0: the preset's
  int threads = 0;    ///< CPU threads per rank; 0: the node's cores shared by its ranks
  std::string json_path;
  bool expert_parallel = false;  ///< also matrixfsdp with experts staying with their owners (MoE presets)
};

/// Declares every option of mfsdp-bench on `app`, bound to the fields of `a`.
void add_bench_options(CLI::App& app, BenchArgs& a) {
  app.add_option("--models", a.models, "model presets (models/model_presets.h: GPT-2, Llama and MoE shapes)")->capture_default_str();
  app.add_option("--layers", a.layers, "override the presets' layer count (0 = keep)")
      ->capture_default_str()
      ->check(CLI::Range(0, cli::kMaxLayers));
  app.add_option("--vocab", a.vocab, "override the presets' vocabulary size (0 = keep; a small one keeps the embedding "
                                     "from dominating the gathered bytes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--threads", a.threads, "CPU threads per rank (0 = the node's cores shared by its ranks; emulated "
                                         "nodes share one machine's cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_option("--placements", a.placements, "placements to measure")
      ->capture_default_str()
      ->check(CLI::IsMember(kPlacementNames.names()));
  app.add_option("--ns-steps", a.ns_steps, "Newton-Schulz iterations, one sweep each")
      ->capture_default_str()
      ->check(CLI::Range(1, cli::kMaxNsSteps));
  BenchCase& base = a.base;
  cli::add_choice(app, "--dtype", base.dtype, kPrecisionNames, "compute/communication dtype (CPU: f32 only)");
  app.add_option("-B,--batch", base.batch, "sequences per rank")->capture_default_str()->check(CLI::Range(1, cli::kMaxBatch));
  app.add_option("-T,--seq", base.seq, "tokens per sequence")->capture_default_str()->check(CLI::Range(1, cli::kMaxSeq));
  app.add_option("--warmup", base.warmup, "unmeasured steps per case")
      ->capture_default_str()
      ->check(CLI::Range(0, cli::kMaxSteps));
  app.add_option("--steps", base.steps, "measured steps per case (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, cli::kMaxSteps));
  app.add_option("--replicate", base.replicas, "HSDP replicas R (divides the world; ddp is skipped)")
      ->capture_default_str()
      ->check(CLI::Range(1, cli::kMaxReplicas));
  cli::add_choice(app, "--batch-orthogonalize", base.batch_orthogonalize, kToggleNames,
                  "on: an owner's same-shape Muon matrices in one batched call, off: one at a time, auto: the "
                  "engine's default");
  app.add_flag("--expert-parallel", a.expert_parallel,
               "for MoE presets also measure matrixfsdp with experts staying with their owners "
               "(sharding.expert_parallel): token traffic in place of expert weight traffic");
  app.add_option("--json", a.json_path, "write every result and the ratios as JSON");
}

/// Measures every case of the sweep over `world` (split into HSDP groups with --replicate);
/// every rank returns the same results. Without replicas `world` is moved into the shard group
/// (and released at the end); a failing case aborts the job with exit 2.
std::vector<BenchResult> run_bench_cases(std::unique_ptr<Communicator>& world, const BenchArgs& a) {
  const BenchCase& base = a.base;
  const int W = world->world_size(), rank = world->rank();
  std::vector<BenchResult> results;
  try {
    const NodeTopology topology = world_node_topology();
    HsdpGroups groups = base.replicas > 1 ? make_hsdp_groups(CommBackend::mpi, base.replicas) : HsdpGroups{};
    if (!groups.shard) groups.shard = std::move(world);
    if (rank == 0)
      std::printf("mfsdp-bench: world %d (replicas %d) on %d node(s), B=%d T=%d per rank, dtype %s, %d warm-up + %d "
                  "measured steps (median; times are the max over ranks)\n",
                  W, base.replicas, topology.nodes(), base.batch, base.seq, dtype_name(base.dtype), base.warmup, base.steps);
    for (const std::string& m : a.models)
      for (int ns : a.ns_steps)
        for (const std::string& p : a.placements) {
          BenchCase c = base;
          if (base.replicas == 1) c.node_of_rank = topology.node_of_rank;  // owners spread over nodes, as in training
          c.model = model_preset(m, a.layers);
          if (a.vocab > 0) c.model.vocab = a.vocab;
          c.ns_steps = ns;
          c.placement = parse_placement(p);
          if (c.replicas > 1 && !placement_traits(c.placement).replicable()) continue;
          results.push_back(run_bench_case(*groups.shard, groups.replica.get(), c));
          if (a.expert_parallel && c.placement == Placement::matrixfsdp && c.replicas == 1 &&
              c.model.family == "qwen2_moe") {
            c.expert_parallel = true;
            results.push_back(run_bench_case(*groups.shard, groups.replica.get(), c));
          }
          if (rank == 0) std::fflush(stdout);
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-bench: %s\n", e.what());
    abort_job(2);
  }
  return results;
}

/// Rank 0's report: the time and memory tables, the headline ratios and (with --json) the JSON
/// file. Returns the exit code (2 when the JSON cannot be written).
int report_bench(const std::vector<BenchResult>& results, const BenchArgs& a, int W) {
  std::printf("\n%s\npeak MiB per rank (max over ranks)\n%s\n", bench_time_table(results).c_str(),
              bench_memory_table(results).c_str());
  const nlohmann::json ratios = bench_ratios(results);
  for (const auto& r : ratios)
    std::printf("headline %s ns=%d %s W=%d: fsdp2/matrixfsdp optimizer step %.2fx, whole step %.2fx\n",
                r["model"].get<std::string>().c_str(), r["ns_steps"].get<int>(), r["dtype"].get<std::string>().c_str(),
                r["world"].get<int>(), r["optimizer_ratio"].get<double>(), r["step_ratio"].get<double>());
  if (a.json_path.empty()) return 0;
  nlohmann::json j{{"world", W}, {"replicas", a.base.replicas}, {"ratios", ratios}, {"results", nlohmann::json::array()}};
  for (const BenchResult& r : results) j["results"].push_back(r.to_json());
  return cli::write_json_output("mfsdp-bench", a.json_path, j.dump(2) + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  CLI::App app{"mfsdp-bench: matrixfsdp vs fsdp2, zero1 and ddp: phase times, bytes and memory per rank"};
  BenchArgs args;
  add_bench_options(app, args);
  // Every rank parses the same arguments, so all of them leave here together.
  if (const int rc = cli::parse_or_exit_code(app, argc, argv); rc >= 0) return rc;

  auto world = make_host_communicator();  // the world's layout and the start-up check
  const int W = world->world_size(), rank = world->rank();
  // An unwritable --json or a bad --threads is refused before minutes of measurement (rank 0 writes the JSON).
  std::string json_error = rank == 0 ? cli::json_output_problem("mfsdp-bench", args.json_path) : "";
  if (json_error.empty() && args.threads > 0)
    if (const std::string e = check_cpu_threads(args.threads); !e.empty()) json_error = "mfsdp-bench: --threads: " + e;
  if (world->all_reduce_scalar(json_error.empty() ? 0 : 1, ReduceOp::max, CommPhase::other) > 0) {
    if (rank == 0) std::fprintf(stderr, "%s\n", json_error.c_str());
    return 2;
  }
  // Ranks sharing a machine split its cores unless --threads says otherwise.
  set_cpu_threads(args.threads > 0 ? args.threads : default_cpu_threads(world->local_size()));
  const std::vector<BenchResult> results = run_bench_cases(world, args);
  if (rank != 0) return 0;
  return report_bench(results, args, W);
}
