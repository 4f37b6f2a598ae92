// test_train_faults: trains like mfsdp-train (same config, --set and --threads) with one fault
// injected from here, never from the product (which reads no test-only switch):
//   --die-after-rank-file STEP  the last rank kills itself (SIGKILL) right after it wrote its file
//                               of the checkpoint of step STEP, before the manifest (a SaveObserver,
//                               checkpoint/owner_checkpoint.h);
//   --nan-grad TENSOR           the engine trains NanGradModel (tests/nan_grad_model.h) over the
//                               run's model: TENSOR's gradient gets a NaN under a finite loss
//                               (TrainerOptions::wrap_units).
// Exit codes as mfsdp-train: 2 bad input, 3 training failure. Used by test_checkpoint_cli.py (case
// crash) and test_train_cli.py (case export), under mpirun.
#include <CLI/CLI.hpp>
#include <mpi.h>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  CLI::App app{"mfsdp-train with an injected fault (test only)"};
  std::string config_path, nan_grad;
  std::vector<std::string> overrides;
  int threads = 1;
  int64_t die_step = -1;
  app.add_option("-c,--config", config_path, "JSON training config")->required();
  app.add_option("--set", overrides, "override a config value: key.path=value (repeatable)");
  app.add_option("--threads", threads, "CPU threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--die-after-rank-file", die_step, "the step of the checkpoint whose save the last rank dies in");
  app.add_option("--nan-grad", nan_grad, "the parameter whose gradient gets a NaN at every step");
  CLI11_PARSE(app, argc, argv);
  DieAfterRankFile save_fault(die_step);
  try {
    const TrainConfig cfg = load_train_config(config_path, overrides);
    set_cpu_threads(threads);
    if (die_step >= 0) set_save_observer(&save_fault);
    TrainerOptions opts;
    if (!nan_grad.empty())
      opts.wrap_units = [&](UnitModel& units) -> std::unique_ptr<UnitModel> {
        return std::make_unique<testing::NanGradModel>(units, nan_grad);
      };
    CommOptions copts;
    copts.timeout_seconds = cfg.sharding.collective_timeout_s;
    auto comm = make_communicator(cfg.sharding.backend, copts);
    run_training(cfg, *comm, opts);
    set_save_observer(nullptr);
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
