// The run log of mfsdp-train: progress lines on rank 0's console, and the run directory's
// metrics.jsonl (one JSON object per line: "train" windows, "eval" results, "checkpoint" saves),
// config.json and summary.json. Only rank 0 writes; every call is a no-op on other ranks.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "runtime/engine/engine_options.h"

namespace mfsdp {

/// "42s", "3m07s", "2h05m".
std::string human_seconds(double seconds);
/// Median of `v` (0 for an empty vector).
double median(std::vector<double> v);
/// The value, or JSON null when it is NaN/Inf.
nlohmann::json nullable(double x);

/// The files RunLog writes in a run directory (the one list; preflight checks each).
inline constexpr const char* kRunDirFiles[] = {"config.json", "metrics.jsonl", "summary.json"};

/// Why the run must not write into `run_dir`: foreign_outputs (apps/train/output_files.h, key
/// logging.run_dir) over kRunDirFiles, each recognised as mfsdp-train's when config.json and
/// summary.json are exactly the canonical dump of their JSON object and metrics.jsonl is empty or
/// starts with one of its records. `input_config` is this run's config file. Reads at most 64 MiB
/// of each file.
std::string foreign_run_files(const std::filesystem::path& run_dir, const std::string& input_config);

/// Console progress and the run directory's files.
class RunLog {
 public:
  /// `run_dir` may be "" (no files). `lead` = this rank writes.
  RunLog(const std::string& run_dir, bool lead);

  bool lead() const { return lead_; }
  const std::filesystem::path& dir() const { return dir_; }

  /// Creates the directory, removes a stale summary.json (a summary only describes a finished
  /// run), opens metrics.jsonl (appending when the run resumes, after dropping a last line that
  /// an interrupted write cut short) and writes config.json
  /// atomically. Throws std::runtime_error naming the file on I/O failure.
  void open(const nlohmann::json& config, bool resumed);
  /// Appends one record to metrics.jsonl (flushed). Throws when the write fails (disk full).
  void record(const nlohmann::json& j);
  /// Writes summary.json atomically.
  void write_summary(const nlohmann::json& summary);

 private:
  std::filesystem::path dir_;
  bool lead_;
  std::ofstream metrics_;
};

/// Steps accumulated since the last progress line: mean loss and tokens/s of the window.
struct ProgressWindow {
  double t_start = 0, loss_sum = 0;
  int64_t steps = 0, tokens = 0;
  void add(const StepStats& s) {
    loss_sum += s.loss;
    ++steps;
    tokens += s.tokens;
  }
  /// Starts a new window at time `now`.
  void restart(double now) { *this = ProgressWindow{now, 0, 0, 0}; }
};

/// This rank's cumulative bytes sent per communication phase, peak bytes per memory category (and
/// of their sum) on `device`, and the block cache's raw allocations so far (on a GPU: cudaMalloc
/// calls; constant once training reaches its steady state) and cached bytes (local, no
/// collective): the "rank0" object of metrics.jsonl train records.
nlohmann::json local_counters(const Communicator& comm, Device device);

/// The "expert_load" of a train record from (token, slot) assignments per layer and expert
/// summed over every rank: per layer {"assignments": total, "fraction": each expert's share,
/// "min", "max": the smallest and largest share}; null without layers (a dense model).
nlohmann::json expert_load_json(const std::vector<std::vector<int64_t>>& counts);

}  // namespace mfsdp
