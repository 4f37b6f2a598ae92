// One job per checkpoint directory: an exclusive advisory lock (flock) on a file in the directory,
// held by the writing process until it exits, with the holder's run directory, host and process id
// written into the same file so a refused job can name it.
#pragma once
#include <string>

namespace mfsdp {

/// Name of the lock file inside a checkpoint directory.
inline constexpr const char* kCheckpointLockFile = ".mfsdp-checkpoint.lock";

/// Takes the lock of checkpoint directory `root` (creating the directory and its lock file) for
/// this process, until it exits, and records `run_dir` (may be empty), the host name and the pid
/// in the lock file. Calling it again for a directory this process already holds does nothing.
/// Returns "" when this process holds the lock, or when the directory or its lock file cannot be
/// created (the caller's writability check reports that); otherwise a message naming the
/// directory and the holder (run directory, host, pid, start time), or the lock file when it is
/// a symbolic link or not a regular file. The kernel releases the lock
/// when the holder dies, so a dead job never blocks a later one.
std::string lock_checkpoint_root(const std::string& root, const std::string& run_dir);

}  // namespace mfsdp
