// The training driver behind mfsdp-train: builds the model, plan and engine from a TrainConfig and
// runs the step loop with progress, validation, checkpoints, metrics, samples and export.
#pragma once
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "apps/train/train_config.h"
#include "apps/train/preflight.h"
#include "comm/communicator.h"
#include "comm/node_topology.h"
#include "runtime/engine/unit_model.h"

namespace mfsdp {

/// Bad input found after start-up (e.g. a corrupted checkpoint), agreed by every rank: the app
/// prints the message and exits 2, like a config error.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The run stopped at a step boundary after checkpoint.notice_signal, SIGTERM or SIGINT
/// (apps/train/preemption.h; a checkpoint was saved when a checkpoint directory is configured).
/// mfsdp-train exits with kExitPreempted.
class Preempted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// EX_TEMPFAIL: "try again" to schedulers that requeue preempted jobs.
constexpr int kExitPreempted = 75;

/// The config key of the collective timeout, as timeout reports name it.
inline constexpr const char* kCollectiveTimeoutKey = "sharding.collective_timeout_s";

/// The constants of lead_io_timeout_seconds: its floor in seconds, and its pace, one more second
/// per this many MiB (a slow shared filesystem's).
inline constexpr int kLeadIoFloorSeconds = 60;
inline constexpr int kLeadIoMiBPerSecond = 8;

/// The bound on a wait behind I/O of `bytes` (ranks waiting while rank 0 alone writes the export
/// or samples, or while the ranks write a checkpoint), in seconds: lead_io_timeout_rule(), so a
/// large write on slow storage does not end the job the way a lost rank would; 0 (wait forever)
/// when collective_timeout_s is 0. The one rule for every such wait; the collective timeout
/// bounds every other collective.
inline double lead_io_timeout_seconds(int64_t bytes, double collective_timeout_s) {
  if (collective_timeout_s <= 0) return 0;
  const double floor_s = kLeadIoFloorSeconds;
  return (collective_timeout_s > floor_s ? collective_timeout_s : floor_s) +
         static_cast<double>(bytes) / (kLeadIoMiBPerSecond << 20);
}
/// lead_io_timeout_seconds in words, for timeout reports, from the same constants:
/// "max(sharding.collective_timeout_s, 60 s) + 1 s per 8 MiB".
inline std::string lead_io_timeout_rule() {
  return "max(" + std::string(kCollectiveTimeoutKey) + ", " + std::to_string(kLeadIoFloorSeconds) + " s) + 1 s per " +
         std::to_string(kLeadIoMiBPerSecond) + " MiB";
}
/// What a timeout report calls the bound of a wait for `what` (which says the bytes, e.g.
/// "rank 0's export, 474.50 MiB written"): "the wait for <what>: <lead_io_timeout_rule()>".
inline std::string lead_io_timeout_name(const std::string& what) {
  return "the wait for " + what + ": " + lead_io_timeout_rule();
}

/// What the command line asks for beyond the config.
struct TrainerOptions {
  bool eval_only = false;  ///< only print the validation loss of the (init_from) model
  double program_start = 0;  ///< steady-clock seconds at process start (wall time includes start-up)
  double agreement_seconds = 0;  ///< time the start-up agreement took (reported in the log)
  /// The world's nodes (summary.json's nodes, ranks_per_node and node_names); one node by default.
  NodeTopology topology;
  /// HSDP (sharding.replicate > 1): the replica group of this rank (comm/comm_factory.h
  /// make_hsdp_groups); run_training's `comm` is then the shard group. nullptr otherwise.
  Communicator* replicas = nullptr;
  /// When set, the engine trains wrap(the model's units) instead of the units themselves: a
  /// UnitModel over the same parameters (it forwards bind() to them), e.g. one that observes or
  /// alters gradients. mfsdp-train leaves it empty; test binaries set it to inject faults.
  std::function<std::unique_ptr<UnitModel>(UnitModel&)> wrap_units;
  /// When set, rank 0 calls it with the export's path right after writing the export, before
  /// the other ranks stop waiting for it. mfsdp-train leaves it empty; test binaries set it to
  /// make the export slow.
  std::function<void(const std::string&)> after_export;
  /// When set, rank 0 calls it right after printing the end-of-run sample, before the other ranks
  /// stop waiting for it. mfsdp-train leaves it empty; test binaries set it to make the sample slow.
  std::function<void()> after_sample;
};

/// Runs training (or evaluation) on every rank of `comm` (and of opts.replicas under HSDP: data,
/// logging and the export then follow the world rank g = replica * S + shard rank, and only
/// replica 0 writes checkpoints, which every replica reads on resume). Rank 0 prints progress and writes the
/// run directory (metrics.jsonl, summary.json) and the export. The summary's comm_bytes and
/// peak_bytes cover the training steps (and periodic evaluations, whose traffic is "other"), not
/// the final evaluation, sampling and export; its tokens/s, MFU and train_seconds exclude evaluation. Throws std::runtime_error when the
/// loss becomes NaN/Inf (naming the step; nothing is exported) or on I/O failures. The process's
/// main() must have called start_stop_signal_thread() (apps/train/preemption.h) first: this arms
/// checkpoint.notice_signal and polls stop_signal() at every step boundary.
void run_training(const TrainConfig& cfg, Communicator& comm, const TrainerOptions& opts);

}  // namespace mfsdp
