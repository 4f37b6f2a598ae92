// The training driver behind mfsdp-train: checks inputs, builds the model, plan and engine from a
// TrainConfig, runs the step loop with progress, validation, metrics, samples and export.
#pragma once
#include <stdexcept>
#include <string>

#include "apps/train_config.h"
#include "comm/communicator.h"

namespace mfsdp {

/// Everything that can be checked without communication: the data shards (train: at least one
/// global batch; val: at least one sequence), the tokenizer files, the init_from model file and
/// the placement, the --eval-only requirements, and that logging.run_dir and output.export's
/// directory are writable (creating them). Returns "" when fine, else one message naming the file
/// and the problem.
std::string preflight_check(const TrainConfig& cfg, int world_size, bool eval_only = false);

/// Takes an exclusive lock (flock) on <logging.run_dir>/.mfsdp.lock (or the checkpoint
/// directory), held until the process exits, so two jobs never share a run directory. Called on
/// rank 0 only. Returns "" when locked (or when there is no directory), else why not.
std::string lock_run_dir(const TrainConfig& cfg);

/// Bad input found after start-up (e.g. a corrupted checkpoint), agreed by every rank: the app
/// prints the message and exits 2, like a config error.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The run stopped at a step boundary after SIGTERM/SIGINT (a checkpoint was saved when a
/// checkpoint directory is configured). mfsdp-train exits with kExitPreempted.
class Preempted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// EX_TEMPFAIL: "try again" to schedulers that requeue preempted jobs.
constexpr int kExitPreempted = 75;

/// What the command line asks for beyond the config.
struct TrainerOptions {
  bool eval_only = false;  ///< only print the validation loss of the (init_from) model
  double program_start = 0;  ///< steady-clock seconds at process start (wall time includes start-up)
  double agreement_seconds = 0;  ///< time the start-up agreement took (reported in the log)
};

/// Runs training (or evaluation) on every rank of `comm`. Rank 0 prints progress and writes the
/// run directory (metrics.jsonl, summary.json) and the export. The summary's comm_bytes and
/// peak_bytes cover the training steps (and periodic evaluations, whose traffic is "other"), not
/// the final evaluation, sampling and export; its tokens/s, MFU and train_seconds exclude evaluation. Throws std::runtime_error when the
/// loss becomes NaN/Inf (naming the step; nothing is exported) or on I/O failures.
void run_training(const TrainConfig& cfg, Communicator& comm, const TrainerOptions& opts);

}  // namespace mfsdp
