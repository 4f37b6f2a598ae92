// The training driver behind mfsdp-train: checks inputs, builds the model, plan and engine from a
// TrainConfig, runs the step loop with progress, validation, metrics, samples and export.
#pragma once
#include <string>

#include "apps/train_config.h"
#include "comm/communicator.h"

namespace mfsdp {

/// Everything that can be checked without communication: the data shards (train: at least one
/// global batch; val: at least one sequence), the tokenizer files, the init_from model file and
/// the placement. Returns "" when fine, else one message naming the file and the problem.
std::string preflight_check(const TrainConfig& cfg, int world_size);

/// What the command line asks for beyond the config.
struct TrainerOptions {
  bool eval_only = false;  ///< only print the validation loss of the (init_from) model
  double program_start = 0;  ///< steady-clock seconds at process start (wall time includes start-up)
};

/// Runs training (or evaluation) on every rank of `comm`. Rank 0 prints progress and writes the
/// run directory (metrics.jsonl, summary.json) and the export. Throws std::runtime_error when the
/// loss becomes NaN/Inf (naming the step; nothing is exported) or on I/O failures.
void run_training(const TrainConfig& cfg, Communicator& comm, const TrainerOptions& opts);

}  // namespace mfsdp
