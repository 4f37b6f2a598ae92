// Start-up checks of mfsdp-train that need no communication.
#pragma once
#include <string>

#include "apps/train/train_config.h"

namespace mfsdp {

/// Everything that can be checked without communication: the data shards (train: at least one
/// global batch; val: at least one sequence), the tokenizer files, the init_from model file and
/// the placement, the --eval-only requirements, and that logging.run_dir and output.export's
/// directory are writable (creating them) and that no output replaces a file mfsdp-train did not
/// write (foreign_outputs: the run directory's files, logging.trace, output.export). Returns ""
/// when fine, else one message naming the config key, the file and the problem.
std::string preflight_check(const TrainConfig& cfg, int world_size, bool eval_only = false);

/// Takes an exclusive lock (flock) on <logging.run_dir>/.mfsdp.lock (or the checkpoint
/// directory), held until the process exits, so two jobs never share a run directory. Called on
/// rank 0 only. Returns "" when locked (or when there is no directory), else why not.
std::string lock_run_dir(const TrainConfig& cfg);

}  // namespace mfsdp
