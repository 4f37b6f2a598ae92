// test_train_faults: trains like mfsdp-train (same config, --set and --threads) with one fault
// injected from here, never from the product (which reads no test-only switch):
//   --die-after-rank-file STEP  the last rank kills itself (SIGKILL) right after it wrote its file
//                               of the checkpoint of step STEP, before the manifest (a SaveObserver,
//                               checkpoint/owner_checkpoint.h);
//   --nan-grad TENSOR           the engine trains NanGradModel (tests/nan_grad_model.h) over the
//                               run's model: TENSOR's gradient gets a NaN under a finite loss
//                               (TrainerOptions::wrap_units);
//   --slow-step SECONDS         every training step takes SECONDS longer (SlowStepModel: the first
//                               unit's forward sleeps; the numbers are the run's own);
//   --slow-export SECONDS       rank 0 sleeps SECONDS after writing the export, while the other
//                               ranks wait for it (TrainerOptions::after_export).
// Rank 0 holds the checkpoint directory's lock as mfsdp-train does (a slow run is the holder in
// test_checkpoint_cli.py's lock case). Exit codes as mfsdp-train: 2 bad input, 3 training
// failure, 75 preempted. Used by
// test_checkpoint_cli.py (cases crash and notice) and test_train_cli.py (cases export and
// slow_export), under mpirun.
#include <CLI/CLI.hpp>
#include <mpi.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "apps/train/checkpointing.h"
#include "apps/train/trainer.h"
#include "checkpoint/owner_checkpoint.h"
#include "comm/comm_factory.h"
#include "runtime/kernels.h"
#include "tests/nan_grad_model.h"

using namespace mfsdp;

namespace {

/// SIGKILLs the last rank after it wrote its rank file of the checkpoint of step `step`.
class DieAfterRankFile : public SaveObserver {
 public:
  explicit DieAfterRankFile(int64_t step) : step_(step) {}
  void after_rank_file(int64_t step, int rank, int world, const std::string& path) override {
    if (step != step_ || rank != world - 1) return;
    std::fprintf(stderr, "[save fault] rank %d dies after writing %s\n", rank, path.c_str());
    std::fflush(stderr);
    std::raise(SIGKILL);
  }

 private:
  int64_t step_;
};

/// Trains `inner` unchanged, except that the first unit's forward sleeps `seconds` while grad
/// mode is on (once per micro-batch of a training step, never during evaluation).
class SlowStepModel : public testing::ForwardingUnitModel {
 public:
  SlowStepModel(UnitModel& inner, double seconds) : ForwardingUnitModel(inner), seconds_(seconds) {}
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override {
    if (u == 0 && grad_mode_enabled()) std::this_thread::sleep_for(std::chrono::duration<double>(seconds_));
    return inner_.forward_unit(u, x, batch, loss_divisor);
  }

 private:
  double seconds_;
};

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  CLI::App app{"mfsdp-train with an injected fault (test only)"};
  std::string config_path, nan_grad;
  std::vector<std::string> overrides;
  int threads = 1;
  int64_t die_step = -1;
  double slow_step = 0, slow_export = 0;
  app.add_option("-c,--config", config_path, "JSON training config")->required();
  app.add_option("--set", overrides, "override a config value: key.path=value (repeatable)");
  app.add_option("--threads", threads, "CPU threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--die-after-rank-file", die_step, "the step of the checkpoint whose save the last rank dies in");
  app.add_option("--nan-grad", nan_grad, "the parameter whose gradient gets a NaN at every step");
  app.add_option("--slow-step", slow_step, "seconds added to every training step")->check(CLI::Range(0.0, 600.0));
  app.add_option("--slow-export", slow_export, "seconds rank 0 sleeps after writing the export")
      ->check(CLI::Range(0.0, 600.0));
  CLI11_PARSE(app, argc, argv);
  if (!nan_grad.empty() && slow_step > 0) {
    std::fprintf(stderr, "test_train_faults: --nan-grad and --slow-step cannot be combined\n");
    return 2;
  }
  DieAfterRankFile save_fault(die_step);
  try {
    const TrainConfig cfg = load_train_config(config_path, overrides);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // Holds the checkpoint directory as mfsdp-train does, so a slow run can be the lock's holder.
    if (const std::string held = rank == 0 ? lock_checkpoint_dir(cfg) : ""; !held.empty()) {
      std::fprintf(stderr, "test_train_faults: %s\n", held.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    set_cpu_threads(threads);
    if (die_step >= 0) set_save_observer(&save_fault);
    TrainerOptions opts;
    if (!nan_grad.empty())
      opts.wrap_units = [&](UnitModel& units) -> std::unique_ptr<UnitModel> {
        return std::make_unique<testing::NanGradModel>(units, nan_grad);
      };
    if (slow_step > 0)
      opts.wrap_units = [&](UnitModel& units) -> std::unique_ptr<UnitModel> {
        return std::make_unique<SlowStepModel>(units, slow_step);
      };
    if (slow_export > 0)
      opts.after_export = [&](const std::string& path) {
        std::fprintf(stderr, "[export fault] rank 0 sleeps %g s after writing %s\n", slow_export, path.c_str());
        std::this_thread::sleep_for(std::chrono::duration<double>(slow_export));
      };
    CommOptions copts;
    copts.timeout_seconds = cfg.sharding.collective_timeout_s;
    copts.timeout_name = kCollectiveTimeoutKey;
    auto comm = make_communicator(cfg.sharding.backend, copts);
    run_training(cfg, *comm, opts);
    set_save_observer(nullptr);
  } catch (const Preempted& e) {  // saved and stopped at a step boundary, as mfsdp-train
    set_save_observer(nullptr);
    std::fprintf(stderr, "test_train_faults: %s\n", e.what());
    return kExitPreempted;
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "test_train_faults: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
  return 0;
}
