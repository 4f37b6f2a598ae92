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
//                               ranks wait for it (TrainerOptions::after_export);
//   --slow-save SECONDS         every checkpoint save takes 2 x SECONDS longer: rank 0 sleeps after
//                               writing its rank file and again after publishing the manifest,
//                               while the other ranks wait for it (a SaveObserver);
//   --slow-sample SECONDS       rank 0 sleeps SECONDS after the end-of-run sample, while the other
//                               ranks wait for it (TrainerOptions::after_sample);
//   --notice-during PHASE       every rank sends itself checkpoint.notice_signal every 0.5 ms from
//                               a moment inside PHASE of step 2 until it exits, so notices land
//                               inside that phase's GEMMs and everything after: startup (one
//                               notice before MPI starts), forward (the first unit's forward),
//                               backward (the backward of the last unit, the first to run),
//                               optimizer (the backward of the first unit, the last to run: the
//                               storm covers the gradient reduction's tail and the optimizer
//                               step), eval (the first validation forward) or save (after the
//                               rank file of the first periodic checkpoint).
// sharding.replicate > 1 trains HSDP over shard and replica groups as mfsdp-train does.
// Rank 0 holds the checkpoint directory's lock as mfsdp-train does (a slow run is the holder in
// test_checkpoint_cli.py's lock case). Exit codes as mfsdp-train: 2 bad input, 3 training
// failure, 75 preempted. Used by
// test_checkpoint_cli.py (cases crash and lock), test_train_cli.py (case export) and
// test_preempt_cli.py (every case), under mpirun.
#include <CLI/CLI.hpp>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "apps/train/checkpointing.h"
#include "apps/train/preemption.h"
#include "apps/train/trainer.h"
#include "checkpoint/owner_checkpoint.h"
#include "comm/comm_factory.h"
#include "runtime/kernels.h"
#include "tests/nan_grad_model.h"

using namespace mfsdp;

namespace {

void sleep_seconds(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

/// SIGKILLs the last rank after it wrote its rank file of the checkpoint of step `die_step` (< 0:
/// never); makes rank 0 sleep `slow` seconds after its rank file and after publishing.
class SaveFaults : public SaveObserver {
 public:
  SaveFaults(int64_t die_step, double slow) : die_step_(die_step), slow_(slow) {}
  void after_rank_file(int64_t step, int rank, int world, const std::string& path) override {
    if (slow_ > 0 && rank == 0) {
      std::fprintf(stderr, "[save fault] rank 0 sleeps %g s after writing %s\n", slow_, path.c_str());
      sleep_seconds(slow_);
    }
    if (step != die_step_ || rank != world - 1) return;
    std::fprintf(stderr, "[save fault] rank %d dies after writing %s\n", rank, path.c_str());
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
  void after_publish(int64_t, const std::string& dir) override {
    if (slow_ <= 0) return;
    std::fprintf(stderr, "[save fault] rank 0 sleeps %g s after publishing %s\n", slow_, dir.c_str());
    sleep_seconds(slow_);
  }

 private:
  int64_t die_step_;
  double slow_;
};

/// Trains `inner` unchanged, except that the first unit's forward sleeps `seconds` while grad
/// mode is on (once per micro-batch of a training step, never during evaluation).
class SlowStepModel : public testing::ForwardingUnitModel {
 public:
  SlowStepModel(UnitModel& inner, double seconds) : ForwardingUnitModel(inner), seconds_(seconds) {}
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override {
    if (u == 0 && grad_mode_enabled()) sleep_seconds(seconds_);
    return inner_.forward_unit(u, x, batch, loss_divisor);
  }

 private:
  double seconds_;
};

/// From start() on, a thread sends `signal` to this process every 0.5 ms until it exits. Only the
/// first start() counts.
class NoticeStorm {
 public:
  void set_signal(int signal) { signal_ = signal; }
  void start() const {
    if (started_.exchange(true)) return;
    std::fprintf(stderr, "[notice fault] %s storm from now on\n", signal_name(signal_).c_str());
    const int sig = signal_;
    std::thread([sig] {
      for (;;) {
        kill(getpid(), sig);
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    }).detach();
  }

 private:
  int signal_ = SIGUSR1;
  mutable std::atomic<bool> started_{false};
};

/// Trains `inner` unchanged and starts `storm` inside `phase` of step 2 (see --notice-during): an
/// identity node on a unit's output, whose backward starts the storm, marks the backward phases.
class NoticeModel : public testing::ForwardingUnitModel {
 public:
  NoticeModel(UnitModel& inner, std::string phase, const NoticeStorm& storm)
      : ForwardingUnitModel(inner), phase_(std::move(phase)), storm_(storm) {}
  Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const override {
    const int last = static_cast<int>(inner_.inventory().unit_names.size()) - 1;
    if (!grad_mode_enabled()) {
      if (phase_ == "eval") storm_.start();
      return inner_.forward_unit(u, x, batch, loss_divisor);
    }
    if (u == 0 && ++steps_ == 2 && phase_ == "forward") storm_.start();
    Tensor out = inner_.forward_unit(u, x, batch, loss_divisor);
    const bool marked = (phase_ == "backward" && u == last) || (phase_ == "optimizer" && u == 0);
    if (steps_ != 2 || !marked || !out.requires_grad()) return out;
    Tensor y = out.clone();
    const NoticeStorm& storm = storm_;
    record(y, "notice_storm", {out}, [out, &storm](const Tensor& g) {
      storm.start();
      accumulate_grad(out, g);
    });
    return y;
  }

 private:
  std::string phase_;
  const NoticeStorm& storm_;
  mutable int steps_ = 0;  ///< training forwards of unit 0 so far (one per step at grad_accum 1)
};

/// Starts the storm after the rank file of the first checkpoint a rank writes.
class SaveNotice : public SaveObserver {
 public:
  explicit SaveNotice(const NoticeStorm& storm) : storm_(storm) {}
  void after_rank_file(int64_t, int, int, const std::string&) override { storm_.start(); }

 private:
  const NoticeStorm& storm_;
};

}  // namespace

int main(int argc, char** argv) {
  start_stop_signal_thread();  // first, as mfsdp-train: every thread inherits the blocked signals
  // --notice-during startup: a notice before MPI starts, kept until the trainer arms its signal
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--notice-during" && std::string(argv[i + 1]) == "startup") kill(getpid(), SIGUSR1);
  MpiSession mpi(&argc, &argv);
  CLI::App app{"mfsdp-train with an injected fault (test only)"};
  std::string config_path, nan_grad;
  std::vector<std::string> overrides;
  int threads = 1;
  int64_t die_step = -1;
  double slow_step = 0, slow_export = 0, slow_save = 0, slow_sample = 0;
  app.add_option("-c,--config", config_path, "JSON training config")->required();
  app.add_option("--set", overrides, "override a config value: key.path=value (repeatable)");
  app.add_option("--threads", threads, "CPU threads per rank")->check(CLI::Range(1, 1024));
  app.add_option("--die-after-rank-file", die_step, "the step of the checkpoint whose save the last rank dies in");
  app.add_option("--nan-grad", nan_grad, "the parameter whose gradient gets a NaN at every step");
  app.add_option("--slow-step", slow_step, "seconds added to every training step")->check(CLI::Range(0.0, 600.0));
  app.add_option("--slow-export", slow_export, "seconds rank 0 sleeps after writing the export")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option("--slow-save", slow_save, "seconds rank 0 sleeps after its rank file and after publishing a checkpoint")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option("--slow-sample", slow_sample, "seconds rank 0 sleeps after the end-of-run sample")
      ->check(CLI::Range(0.0, 600.0));
  std::string notice_phase;
  app.add_option("--notice-during", notice_phase, "the phase of step 2 inside which notices start")
      ->check(CLI::IsMember({"startup", "forward", "backward", "optimizer", "eval", "save"}));
  CLI11_PARSE(app, argc, argv);
  if (int(!nan_grad.empty()) + int(slow_step > 0) + int(!notice_phase.empty()) > 1 ||
      (!notice_phase.empty() && (die_step >= 0 || slow_save > 0))) {
    std::fprintf(stderr, "test_train_faults: --nan-grad, --slow-step, --notice-during and the save faults cannot be "
                         "combined\n");
    return 2;
  }
  SaveFaults save_fault(die_step, slow_save);
  NoticeStorm storm;
  SaveNotice save_notice(storm);
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
    storm.set_signal(notice_signal_number(cfg.checkpoint.notice_signal));
    if (die_step >= 0 || slow_save > 0) set_save_observer(&save_fault);
    if (notice_phase == "save") set_save_observer(&save_notice);
    TrainerOptions opts;
    if (!nan_grad.empty())
      opts.wrap_units = [&](UnitModel& units) -> std::unique_ptr<UnitModel> {
        return std::make_unique<testing::NanGradModel>(units, nan_grad);
      };
    if (slow_step > 0)
      opts.wrap_units = [&](UnitModel& units) -> std::unique_ptr<UnitModel> {
        return std::make_unique<SlowStepModel>(units, slow_step);
      };
    if (!notice_phase.empty() && notice_phase != "startup" && notice_phase != "save")
      opts.wrap_units = [&](UnitModel& units) -> std::unique_ptr<UnitModel> {
        return std::make_unique<NoticeModel>(units, notice_phase, storm);
      };
    if (slow_export > 0)
      opts.after_export = [&](const std::string& path) {
        std::fprintf(stderr, "[export fault] rank 0 sleeps %g s after writing %s\n", slow_export, path.c_str());
        sleep_seconds(slow_export);
      };
    if (slow_sample > 0)
      opts.after_sample = [&] {
        std::fprintf(stderr, "[sample fault] rank 0 sleeps %g s after the sample\n", slow_sample);
        sleep_seconds(slow_sample);
      };
    CommOptions copts;
    copts.timeout_seconds = cfg.sharding.collective_timeout_s;
    copts.timeout_name = kCollectiveTimeoutKey;
    if (cfg.sharding.replicate > 1) {  // HSDP groups, as mfsdp-train makes them
      HsdpGroups groups = make_hsdp_groups(cfg.sharding.backend, cfg.sharding.replicate, copts);
      opts.replicas = groups.replica.get();
      run_training(cfg, *groups.shard, opts);
    } else {
      auto comm = make_communicator(cfg.sharding.backend, copts);
      run_training(cfg, *comm, opts);
    }
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
