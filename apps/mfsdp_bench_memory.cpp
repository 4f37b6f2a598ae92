// mfsdp-bench-memory: per-rank peak memory by category for each placement, and the
// optimizer-step time of that step (max over ranks; a rough figure when ranks share cores).
//   mpirun -np 4 --oversubscribe mfsdp-bench-memory [--config configs/gpt2_124m_shakespeare.json]
// Builds the model from the config's `model` section, runs one training step per placement on
// random tokens (B sequences of T tokens per rank), and prints the max over ranks of each
// category's peak. "persistent" = parameter shard + gradient shard + optimizer state.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "comm/mpi_backends.h"
#include "models/gpt.h"
#include "planner/planner.h"
#include "runtime/engine/sharded_engine.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"

using namespace mfsdp;

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  CLI::App app{"Per-rank peak memory of matrixfsdp, fsdp2, zero1 and ddp for one training step"};
  std::string config = std::string(MFSDP_SOURCE_DIR) + "/configs/gpt2_124m_shakespeare.json";
  int B = 1, T = 64;
  std::vector<std::string> placements{"matrixfsdp", "fsdp2", "zero1", "ddp"};
  app.add_option("--config", config, "config whose `model` section is measured")->capture_default_str();
  app.add_option("-B,--batch", B, "sequences per rank")->capture_default_str();
  app.add_option("-T,--seq", T, "sequence length")->capture_default_str();
  app.add_option("--placements", placements, "placements to measure")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  GPTConfig cfg;
  try {
    std::ifstream f(config);
    if (!f) throw std::runtime_error(config + ": cannot open");
    auto m = nlohmann::json::parse(f).at("model");
    cfg.n_layer = m.value("n_layer", cfg.n_layer);
    cfg.n_head = m.value("n_head", cfg.n_head);
    cfg.n_embd = m.value("n_embd", cfg.n_embd);
    cfg.seq_len = std::max(T, m.value("seq_len", cfg.seq_len));
    cfg.vocab_size = m.value("vocab_size", cfg.vocab_size);
    cfg.tie_embeddings = m.value("tie_embeddings", cfg.tie_embeddings);
    cfg.validate();
    for (auto& p : placements) parse_placement(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-bench-memory: %s: %s\n", config.c_str(), e.what());
    return 2;
  }
  auto comm = make_mpi_communicator();
  const int W = comm->world_size(), rank = comm->rank();
  int local = 1;
  {
    MPI_Comm l;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &l);
    MPI_Comm_size(l, &local);
    MPI_Comm_free(&l);
  }
  set_cpu_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local));
  auto& mt = MemoryTracker::instance();
  auto mib = [](double b) { return b / (1024.0 * 1024.0); };
  const MemCategory cats[] = {MemCategory::parameters, MemCategory::gradients, MemCategory::optimizer_state,
                              MemCategory::gathered_params, MemCategory::gathered_grads, MemCategory::activations,
                              MemCategory::comm_buffers};
  if (rank == 0)
    std::printf("GPT %d layers, width %d, vocab %d: %.1fM parameters; world %d, B=%d T=%d per rank\n"
                "peak MiB per rank (max over ranks); optimizer step seconds (max over ranks)\n"
                "%-11s %9s %9s %9s %11s %9s %9s %9s %9s %9s %9s\n",
                cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.num_params() / 1e6, W, B, T, "placement", "params",
                "grads", "opt_state", "persistent", "gath_par", "gath_grad", "activ", "comm", "total", "opt_s");
  std::map<std::string, double> persistent, gathered;
  double largest_pair = 0;
  for (const std::string& pname : placements) {
    double row[10] = {0}, opt_seconds = 0;
    {
      GPT model(cfg);
      ShardPlan plan = make_plan(model.inventory(), W, parse_placement(pname));
      EngineOptions opts;
      mt.reset_peaks();
      ShardedEngine engine(model, *comm, plan, opts);
      engine.init_parameters(1);
      std::vector<int32_t> tok(B * T), tgt(B * T);
      for (int i = 0; i < B * T; ++i) {
        tok[i] = (i * 31 + rank) % cfg.vocab_size;
        tgt[i] = (i * 17 + 1) % cfg.vocab_size;
      }
      opt_seconds = engine.train_step({{tokens_tensor(tok, {B, T}), tokens_tensor(tgt, {B, T})}}, 0).t_optimizer;
      int k = 0;
      for (MemCategory c : cats) row[k++] = static_cast<double>(mt.peak(Device::CPU, c));
      row[k++] = static_cast<double>(mt.peak_total(Device::CPU));
      if (pname == placements.front()) {
        for (size_t u = 0; u < plan.units.size(); ++u) {  // a unit plus the next one (prefetch)
          const double a = 4.0 * plan.units[u].total_numel();
          const double b = u + 1 < plan.units.size() ? 4.0 * plan.units[u + 1].total_numel() : 0.0;
          largest_pair = std::max(largest_pair, a + b);
        }
        if (cfg.tie_embeddings)  // the head unit also gathers the embedding unit
          largest_pair = std::max(largest_pair, 4.0 * (plan.units.front().total_numel() + plan.units.back().total_numel()));
      }
    }
    for (double& v : row) v = comm->all_reduce_scalar(v, ReduceOp::max, CommPhase::other);
    opt_seconds = comm->all_reduce_scalar(opt_seconds, ReduceOp::max, CommPhase::other);
    const double pers = row[0] + row[1] + row[2];
    persistent[pname] = pers;
    gathered[pname] = row[3];
    if (rank == 0)
      std::printf("%-11s %9.1f %9.1f %9.1f %11.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f\n", pname.c_str(), mib(row[0]),
                  mib(row[1]), mib(row[2]), mib(pers), mib(row[3]), mib(row[4]), mib(row[5]), mib(row[6]), mib(row[7]),
                  opt_seconds);
  }
  if (rank == 0 && persistent.count("matrixfsdp")) {
    const double mf = persistent["matrixfsdp"];
    if (persistent.count("fsdp2"))
      std::printf("matrixfsdp persistent / fsdp2 = %.3f (target <= 1.10)\n", mf / persistent["fsdp2"]);
    if (persistent.count("zero1"))
      std::printf("matrixfsdp persistent / zero1 = %.3f (target <= 0.50)\n", mf / persistent["zero1"]);
    std::printf("matrixfsdp gathered-parameter peak %.1f MiB vs largest unit + next unit %.1f MiB\n",
                mib(gathered["matrixfsdp"]), mib(largest_pair));
  }
  return 0;
}
