// mfsdp-train: config-driven pretraining of GPT-2 and Llama models with MatrixFSDP.
//   mpirun -np N mfsdp-train --config configs/X.json [--set key.path=value ...] [--print-config] [--eval-only]
// Without mpirun it runs as world size 1. Exit codes: 0 success, 2 bad input (command line, config,
// data, model file, checkpoint, ranks that disagree; reported on every rank before training),
// 3 training failure, 75 preempted (SIGTERM/SIGINT; a checkpoint was saved).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "apps/train/agreement.h"
#include "apps/train/trainer.h"
#include "comm/comm_factory.h"
#include "runtime/core/cpu_affinity.h"
#include "runtime/kernels.h"

using namespace mfsdp;

namespace {

// MPI_Iallreduce of n ints over MPI_COMM_WORLD, bounded by the collective timeout.
void startup_allreduce(const int* in, int* out, int n, MPI_Op op, double timeout) {
  MPI_Request req;
  MPI_Iallreduce(in, out, n, MPI_INT, op, MPI_COMM_WORLD, &req);
  wait_or_abort(req, timeout, MPI_COMM_WORLD, "the start-up checks");
}

}  // namespace

int main(int argc, char** argv) {
  const double program_start =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  MpiSession mpi(&argc, &argv);
  int rank = 0, world = 1, local_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  {
    MPI_Comm local;  // ranks sharing this machine split its cores (no MPI traffic: a local query)
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
  }
  spdlog::set_pattern("%v");
  if (rank != 0) spdlog::set_level(spdlog::level::warn);

  CLI::App app{"MatrixFSDP: train a GPT with whole-matrix owner sharding (Muon + AdamW)"};
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false, eval_only = false;
  int threads = 0;
  app.add_option("-c,--config", config_path, "JSON training config (see configs/README.md)")->required();
  app.add_option("--set", overrides, "override a config value: key.path=value (repeatable)");
  app.add_flag("--print-config", print_config, "print the effective config and exit");
  app.add_flag("--eval-only", eval_only, "only evaluate model.init_from on the validation split");
  app.add_option("--threads", threads,
                 "CPU threads per rank, 1..1024, at most the CPUs the launcher gave the rank (default: those CPUs; "
                 "unbound ranks split the machine's cores)")
      ->check(CLI::Range(1, 1024));
  std::string error;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help: every rank gets the same argument, so all leave here
      if (rank == 0) app.exit(e);
      return 0;
    }
    error = std::string("command line: ") + e.what();
  }

  // ---- everything that can fail on bad input, before any training collective ----
  if (error.empty() && threads > 0) error = check_cpu_threads(threads);
  TrainConfig cfg;
  if (error.empty()) {
    try {
      cfg = load_train_config(config_path, overrides);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // One job per run directory: a second one (e.g. a requeued job overlapping a live one) would
  // interleave writes and remove the other's checkpoint in progress. Held until exit.
  if (error.empty() && rank == 0 && !print_config && !eval_only) error = lock_run_dir(cfg);
  if (error.empty() && !print_config) error = preflight_check(cfg, world, eval_only);
  // Agree on the outcome and on the mode, so a problem or a different flag seen by one rank (a
  // file missing on its node, a stray --eval-only) stops all of them. Bounded by the collective
  // timeout: a rank stuck in its checks cannot hang the others.
  const double timeout = error.empty() ? cfg.sharding.collective_timeout_s : TrainConfig{}.sharding.collective_timeout_s;
  const int mine[3] = {error.empty() ? 0 : 1, print_config ? 1 : 0, eval_only ? 1 : 0};
  int most[3] = {0, 0, 0}, least[3] = {0, 0, 0};
  startup_allreduce(mine, most, 3, MPI_MAX, timeout);
  startup_allreduce(mine, least, 3, MPI_MIN, timeout);
  if (most[0]) {
    if (mine[0]) std::fprintf(stderr, "mfsdp-train: error%s: %s\n", world > 1 ? (" (rank " + std::to_string(rank) + ")").c_str() : "", error.c_str());
    else std::fprintf(stderr, "mfsdp-train: rank %d stops: another rank found bad input\n", rank);
    return 2;
  }
  if (most[1] != least[1] || most[2] != least[2]) {
    std::fprintf(stderr, "mfsdp-train: error (rank %d): the ranks were launched with different flags (%s); nothing was started\n",
                 rank, most[1] != least[1] ? "--print-config on some ranks only" : "--eval-only on some ranks only");
    return 2;
  }
  if (print_config) {
    if (rank == 0) std::printf("%s\n", cfg.to_json().dump(2).c_str());
    return 0;
  }
  // Every rank must run the same config, build and input files: compared before any training
  // collective, so a stale node is named instead of hanging or training a wrong model.
  const double t_agree = MPI_Wtime();
  const std::string disagreement = check_agreement(run_facts(cfg), MPI_COMM_WORLD, timeout);
  if (!disagreement.empty()) {
    std::fprintf(stderr, "mfsdp-train: error (rank %d): %s\n", rank, disagreement.c_str());
    return 2;
  }
  const double agree_seconds = MPI_Wtime() - t_agree;

  set_cpu_threads(threads > 0 ? threads : default_cpu_threads(local_size));
  try {
    CommOptions copts;
    copts.debug_checks = cfg.sharding.debug_checks || comm_debug_from_env();
    copts.reduce_chunk_bytes = cfg.sharding.reduce_chunk_bytes;
    copts.timeout_seconds = cfg.sharding.collective_timeout_s;
    CudaCommOptions cuda_opts;  // the CUDA backends select the process's device first
    cuda_opts.blocking = cfg.sharding.nccl_blocking;
    TrainerOptions topts{eval_only, program_start, agree_seconds};
    if (cfg.sharding.replicate > 1) {  // HSDP: shard groups of world / R ranks, R replicas
      if (world % cfg.sharding.replicate != 0)
        throw InputError("sharding.replicate = " + std::to_string(cfg.sharding.replicate) +
                         " does not divide the world size " + std::to_string(world));
      HsdpGroups groups = make_hsdp_groups(cfg.sharding.backend, cfg.sharding.replicate, copts, cuda_opts);
      topts.replicas = groups.replica.get();
      run_training(cfg, *groups.shard, topts);
    } else {
      auto comm = make_communicator(cfg.sharding.backend, copts, cuda_opts);
      run_training(cfg, *comm, topts);
    }
  } catch (const InputError& e) {  // every rank agreed on it: a clean exit, like a config error
    std::fprintf(stderr, "mfsdp-train: error (rank %d): %s\n", rank, e.what());
    return 2;
  } catch (const Preempted& e) {
    if (rank == 0) std::fprintf(stderr, "mfsdp-train: %s\n", e.what());
    return kExitPreempted;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-train: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
  return 0;
}
