// mfsdp-train: config-driven pretraining of GPT-2 and Llama models with MatrixFSDP.
//   mpirun -np N mfsdp-train --config configs/X.json [--set key.path=value ...] [--print-config] [--eval-only]
// Without mpirun it runs as world size 1. Exit codes: 0 success, 2 bad input (command line, config,
// data, model file, checkpoint, ranks that disagree; reported on every rank before training),
// 3 training failure, 75 preempted (checkpoint.notice_signal, SIGTERM or SIGINT; a checkpoint was saved).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <spdlog/spdlog.h>

#include "apps/train/agreement.h"
#include "apps/train/checkpointing.h"
#include "apps/train/preemption.h"
#include "apps/train/trainer.h"
#include "comm/comm_factory.h"
#include "runtime/core/clock.h"
#include "runtime/core/cpu_affinity.h"
#include "runtime/kernels.h"

using namespace mfsdp;

namespace {

/// The command line, beyond the config's own keys.
struct Args {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false, eval_only = false;
  int threads = 0;  ///< 0: the CPUs the launcher gave the rank
};

/// Parses the command line into `args`. Returns false after --help (rank 0 printed it); a bad
/// command line sets `error` (reported with every other start-up error).
bool parse_command_line(int argc, char** argv, int rank, Args& args, std::string& error) {
  CLI::App app{"MatrixFSDP: train a GPT with whole-matrix owner sharding (Muon + AdamW)"};
  app.add_option("-c,--config", args.config_path, "JSON training config (see configs/README.md)")->required();
  app.add_option("--set", args.overrides, "override a config value: key.path=value (repeatable)");
  app.add_flag("--print-config", args.print_config, "print the effective config and exit");
  app.add_flag("--eval-only", args.eval_only, "only evaluate model.init_from on the validation split");
  app.add_option("--threads", args.threads,
                 "CPU threads per rank, 1..1024, at most the CPUs the launcher gave the rank (default: those CPUs; "
                 "unbound ranks split the machine's cores)")
      ->check(CLI::Range(1, 1024));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help: every rank gets the same argument, so all leave here
      if (rank == 0) app.exit(e);
      std::fflush(stdout);  // before MPI_Finalize, which may wait for ranks that did not leave
      return false;
    }
    error = std::string("command line: ") + e.what();
  }
  return true;
}

/// Rank 0's `text` on every rank (collective over `host`: its length, then its bytes).
std::string from_rank0(Communicator& host, const std::string& text) {
  const int64_t mine = host.rank() == 0 ? static_cast<int64_t>(text.size()) : 0;
  std::vector<int64_t> lens(static_cast<size_t>(host.world_size()));
  host.all_gather_host(&mine, lens.data(), sizeof(int64_t), CommPhase::other);
  if (lens[0] == 0) return "";
  std::vector<int32_t> buf(static_cast<size_t>((lens[0] + 3) / 4), 0);
  if (host.rank() == 0) std::memcpy(buf.data(), text.data(), text.size());
  host.broadcast(buf.data(), static_cast<int64_t>(buf.size()), DType::i32, 0, CommPhase::other);
  return std::string(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(lens[0]));
}

/// Everything that can fail on bad input, before any training collective: the thread count, the
/// config, the run- and checkpoint-directory locks (rank 0, its outcome shared over `host`) and
/// the preflight checks, after the command line's `error`. Every rank calls it. Returns the first
/// error ("" if none).
std::string check_inputs(const Args& args, Communicator& host, TrainConfig& cfg, std::string error) {
  const int rank = host.rank(), world = host.world_size();
  if (error.empty() && args.threads > 0) error = check_cpu_threads(args.threads);
  if (error.empty()) {
    try {
      cfg = load_train_config(args.config_path, args.overrides);
      error = apply_global_batch(cfg, world);  // grad_accum at this world size, on every rank alike
      // Every later start-up collective is bounded by the config's timeout: a rank that left
      // early (e.g. --help given to it alone) stops the others within it, with a report.
      host.set_timeout(cfg.sharding.collective_timeout_s, kCollectiveTimeoutKey);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // One job per run directory and per checkpoint directory: a second one (e.g. a requeued job
  // overlapping a live one) would interleave writes, resume the other's checkpoints and remove
  // them. Rank 0 takes both locks (held until exit) before any check touches the directories;
  // every rank learns the outcome, so all stop with the holder named.
  const bool lock = error.empty() && rank == 0 && !args.print_config && !args.eval_only;
  std::string lock_error = lock ? lock_run_dir(cfg) : "";
  if (lock && lock_error.empty()) lock_error = lock_checkpoint_dir(cfg);
  set_comm_context("the start-up checks");
  lock_error = from_rank0(host, lock_error);
  if (error.empty()) error = lock_error;
  if (error.empty() && !args.print_config) error = preflight_check(cfg, world, args.eval_only);
  return error;
}

/// Agrees on the outcome of the start-up checks and on the mode, so a problem or a different flag
/// seen by one rank (a file missing on its node, a stray --eval-only) stops all of them; then on
/// the config, build and input files (check_agreement). Bounded by `host`'s timeout: a rank
/// stuck in its checks cannot hang the others. Returns the exit code when the run stops here
/// (2 bad input, 0 after --print-config), or -1 to train.
int agree_to_start(Communicator& host, const Args& args, const std::string& start_error, const TrainConfig& cfg) {
  const int rank = host.rank(), world = host.world_size();
  // The input files are hashed first: one that cannot be read as a regular file stops every rank.
  std::string error = start_error;
  std::map<std::string, std::string> facts;
  if (error.empty()) facts = run_facts(cfg, error);
  set_comm_context("the start-up checks");
  // One maximum over {error, print, eval, -error, -print, -eval}: the last three give the minima.
  const float mine[3] = {error.empty() ? 0.f : 1.f, args.print_config ? 1.f : 0.f, args.eval_only ? 1.f : 0.f};
  float most[6] = {mine[0], mine[1], mine[2], -mine[0], -mine[1], -mine[2]};
  host.all_reduce(most, 6, DType::f32, ReduceOp::max, CommPhase::other);
  if (most[0] > 0) {
    if (!error.empty()) std::fprintf(stderr, "mfsdp-train: error%s: %s\n", world > 1 ? (" (rank " + std::to_string(rank) + ")").c_str() : "", error.c_str());
    else std::fprintf(stderr, "mfsdp-train: rank %d stops: another rank found bad input\n", rank);
    return 2;
  }
  if (most[1] != -most[4] || most[2] != -most[5]) {
    std::fprintf(stderr, "mfsdp-train: error (rank %d): the ranks were launched with different flags (%s); nothing was started\n",
                 rank, most[1] != -most[4] ? "--print-config on some ranks only" : "--eval-only on some ranks only");
    return 2;
  }
  if (args.print_config) {
    if (rank == 0) std::printf("%s\n", cfg.to_json().dump(2).c_str());
    return 0;
  }
  // Every rank must run the same config, build and input files: compared before any training
  // collective, so a stale node is named instead of hanging or training a wrong model.
  set_comm_context("the start-up agreement");
  const std::string disagreement = check_agreement(facts, host);
  set_comm_context("");
  if (!disagreement.empty()) {
    std::fprintf(stderr, "mfsdp-train: error (rank %d): %s\n", rank, disagreement.c_str());
    return 2;
  }
  return -1;
}

/// Makes the training communicator(s) of sharding.backend and runs training. Returns the exit
/// code (0 done, 2 bad input found after start-up, 75 preempted); another failure aborts the job
/// with exit code 3.
int train(const TrainConfig& cfg, int rank, int world, const TrainerOptions& topts) {
  try {
    CommOptions copts;
    copts.debug_checks = cfg.sharding.debug_checks || comm_debug_from_env();
    copts.reduce_chunk_bytes = cfg.sharding.reduce_chunk_bytes;
    copts.timeout_seconds = cfg.sharding.collective_timeout_s;
    copts.timeout_name = kCollectiveTimeoutKey;
    CudaCommOptions cuda_opts;  // the CUDA backends select the process's device first
    cuda_opts.blocking = cfg.sharding.nccl_blocking;
    if (cfg.sharding.replicate > 1) {  // HSDP: shard groups of world / R ranks, R replicas
      if (world % cfg.sharding.replicate != 0)
        throw InputError("sharding.replicate = " + std::to_string(cfg.sharding.replicate) +
                         " does not divide the world size " + std::to_string(world));
      HsdpGroups groups = make_hsdp_groups(cfg.sharding.backend, cfg.sharding.replicate, copts, cuda_opts);
      if (rank == 0 && groups.spans_nodes) spdlog::warn("[warning] HSDP layout: {}", groups.layout);
      else if (rank == 0) spdlog::info("HSDP layout: {}", groups.layout);
      TrainerOptions hsdp = topts;
      hsdp.replicas = groups.replica.get();
      run_training(cfg, *groups.shard, hsdp);
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
    abort_job(3);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const double program_start = now_seconds();
  // Before MPI and before any thread: every thread inherits the blocked stop signals, and a notice
  // during start-up is kept (apps/train/preemption.h).
  start_stop_signal_thread();
  MpiSession mpi(&argc, &argv);
  // Start-up traffic (small host data) goes over the MPI world before the training backend
  // exists, bounded by the default collective timeout until the config says otherwise.
  CommOptions host_opts;
  host_opts.timeout_seconds = TrainConfig{}.sharding.collective_timeout_s;
  host_opts.timeout_name = kCollectiveTimeoutKey;
  auto host = make_host_communicator(host_opts);
  const int rank = host->rank(), world = host->world_size();
  spdlog::set_pattern("%v");
  if (rank != 0) spdlog::set_level(spdlog::level::warn);

  Args args;
  std::string error;
  if (!parse_command_line(argc, argv, rank, args, error)) return 0;
  TrainConfig cfg;
  error = check_inputs(args, *host, cfg, error);
  if (error.empty()) arm_notice_signal(notice_signal_number(cfg.checkpoint.notice_signal));
  const double t_agree = now_seconds();
  const int stop = agree_to_start(*host, args, error, cfg);
  if (stop >= 0) return stop;
  TrainerOptions topts;
  topts.eval_only = args.eval_only;
  topts.program_start = program_start;
  topts.agreement_seconds = now_seconds() - t_agree;
  topts.topology = world_node_topology();  // every rank is known to be running: a blocking collective is safe
  if (rank == 0) spdlog::info("topology: {}", topts.topology.describe());
  // Ranks sharing this machine split its cores.
  set_cpu_threads(args.threads > 0 ? args.threads : default_cpu_threads(host->local_size()));
  return train(cfg, rank, world, topts);
}
