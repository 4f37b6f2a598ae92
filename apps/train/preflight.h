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

/// Name of the lock file lock_run_dir holds in a run directory.
inline constexpr const char* kRunDirLockFile = ".mfsdp.lock";

/// Why logging.trace must not be written now: inside a directory another running mfsdp-train job
/// holds locked (its run or checkpoint directory), a file the run reads or writes otherwise, or an
/// existing file that is not a trace of mfsdp-train (foreign_outputs). "" when it may be written.
/// Checked at start-up and again just before the trace is written.
std::string trace_output_problem(const TrainConfig& cfg);

/// The same for output.export (its weights file and, for a directory, its config.json): inside
/// another running job's directory, inside this run's checkpoint, resume or init_from directory,
/// a file of the run, or existing files that are not an earlier export (foreign_export_files).
std::string export_output_problem(const TrainConfig& cfg);

/// Takes an exclusive lock (flock) on <logging.run_dir>/.mfsdp.lock (or the checkpoint
/// directory), held until the process exits, so two jobs never share a run directory. Called on
/// rank 0 only. Returns "" when locked (or when there is no directory), else why not.
std::string lock_run_dir(const TrainConfig& cfg);

}  // namespace mfsdp
