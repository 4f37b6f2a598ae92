#include "apps/train/run_log.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string_view>

#include "apps/train/output_files.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"
#include "runtime/block_cache.h"
#include "runtime/memory.h"

namespace mfsdp {

using json = nlohmann::json;

std::string human_seconds(double seconds) {
  const int64_t s = std::llround(std::max(0.0, seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

json nullable(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

namespace {

// Whether `text`, the contents of run-directory file `name`, is what RunLog writes there.
bool written_by_run_log(const std::string& name, const std::string& text) {
  const auto parse = [](std::string_view s) {
    return json_nesting_depth(s) <= kMaxJsonDepth ? json::parse(s, nullptr, false) : json(json::value_t::discarded);
  };
  if (name == "metrics.jsonl") {
    if (text.empty()) return true;
    const std::string_view first(text.data(), std::min(text.find('\n'), text.size()));
    const json j = parse(first);
    const std::string type = j.is_object() ? j.value("type", json()).dump() : "";
    return (type == "\"train\"" || type == "\"eval\"" || type == "\"checkpoint\"") && j.dump() == first;
  }
  const json j = parse(text);
  const char* key = name == "summary.json" ? "state_fingerprint" : "model";
  return !j.is_discarded() && j.is_object() && j.contains(key) && j.dump(2) + "\n" == text;
}

// A run killed inside a write leaves metrics.jsonl ending in part of a record. Resuming drops
// that part (it never was a whole record), so the next record starts its own line and every line
// stays one JSON record; says how many bytes went.
void drop_partial_last_line(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec || size == 0) return;
  std::ifstream in(path, std::ios::binary);
  int64_t keep = -1;  // bytes up to and including the last newline
  std::string chunk;
  for (int64_t end = size; end > 0 && keep < 0;) {
    const int64_t start = std::max<int64_t>(0, end - (int64_t{1} << 16));
    chunk.resize(static_cast<size_t>(end - start));
    in.seekg(start);
    if (!in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()))) return;  // unreadable: left as it is
    if (const size_t nl = chunk.rfind('\n'); nl != std::string::npos) keep = start + static_cast<int64_t>(nl) + 1;
    end = start;
  }
  keep = std::max<int64_t>(keep, 0);
  if (keep == size) return;
  std::filesystem::resize_file(path, static_cast<uintmax_t>(keep), ec);
  if (ec) throw std::runtime_error(path.string() + ": cannot drop its cut last line: " + ec.message());
  spdlog::warn("{}: dropped its last {} bytes, a record cut short by the interrupted run", path.string(), size - keep);
}

// metrics.jsonl is appended in place, so it must be this directory's own file: a symbolic link is
// refused (another run's history would be written through it), and a file with other hard links
// (a snapshot made with rsync --link-dest or cp -l) is first copied to a file of its own, which
// leaves the snapshot as it was. A fresh run removes the old file instead of truncating it.
void own_metrics_file(const std::filesystem::path& path, bool resumed) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  if (!fs::exists(st)) return;
  if (fs::is_symlink(st))
    throw std::runtime_error(path.string() + " is a symbolic link (to " + fs::read_symlink(path, ec).string() +
                             "); refusing to write a run's history through it");
  if (fs::hard_link_count(path, ec) <= 1) return;
  if (!resumed) {
    fs::remove(path);
    return;
  }
  const std::string copy = create_temp_beside(path.string());
  try {
    fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
    fs::rename(copy, path);
  } catch (...) {
    fs::remove(copy, ec);
    throw;
  }
}

}  // namespace

std::string foreign_run_files(const std::filesystem::path& run_dir, const std::string& input_config) {
  std::vector<OwnedOutput> files;
  for (const char* name : kRunDirFiles) {
    const auto ours = [name](const std::filesystem::path& path) {
      constexpr size_t kMaxRead = size_t{64} << 20;
      const std::string text = read_input_file(path.string(), "", kMaxRead, false);
      std::error_code ec;
      const bool whole = std::string(name) == "metrics.jsonl" || std::filesystem::file_size(path, ec) <= kMaxRead;
      return whole && written_by_run_log(name, text);
    };
    files.push_back({run_dir / name, std::string("a run's ") + name, ours});
  }
  return foreign_outputs(files, "logging.run_dir", input_config);
}

RunLog::RunLog(const std::string& run_dir, bool lead) : dir_(run_dir), lead_(lead) {}

void RunLog::open(const json& config, bool resumed) {
  if (!lead_ || dir_.empty()) return;
  std::filesystem::create_directories(dir_);
  std::filesystem::remove(dir_ / "summary.json");
  own_metrics_file(dir_ / "metrics.jsonl", resumed);
  if (resumed) drop_partial_last_line(dir_ / "metrics.jsonl");
  metrics_.open(dir_ / "metrics.jsonl", resumed ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw std::runtime_error((dir_ / "metrics.jsonl").string() + ": cannot open for writing");
  write_file_swap((dir_ / "config.json").string(), config.dump(2) + "\n");
}

void RunLog::record(const json& j) {
  if (!metrics_.is_open()) return;
  metrics_ << j.dump() << "\n" << std::flush;
  if (!metrics_) throw std::runtime_error((dir_ / "metrics.jsonl").string() + ": write failed (disk full?)");
}

void RunLog::write_summary(const json& summary) {
  if (lead_ && !dir_.empty()) write_file_swap((dir_ / "summary.json").string(), summary.dump(2) + "\n");
}

json local_counters(const Communicator& comm, Device device) {
  json comm_sent, peaks;
  for (int p = 0; p < static_cast<int>(CommPhase::count); ++p)
    comm_sent[comm_phase_name(static_cast<CommPhase>(p))] = comm.counters().phase[p].bytes_sent;
  for (int c = 0; c < static_cast<int>(MemCategory::count); ++c)
    peaks[mem_category_name(static_cast<MemCategory>(c))] =
        MemoryTracker::instance().peak(device, static_cast<MemCategory>(c));
  const BlockCacheStats blocks = block_cache(device).stats();
  return json{{"comm_bytes_sent", comm_sent}, {"peak_bytes", peaks},
              {"peak_total_bytes", MemoryTracker::instance().peak_total(device)},
              {"raw_allocs", blocks.raw_allocs}, {"cached_bytes", blocks.cached_bytes}};
}

nlohmann::json expert_load_json(const std::vector<std::vector<int64_t>>& counts) {
  if (counts.empty()) return nullptr;
  nlohmann::json layers = nlohmann::json::array();
  for (const std::vector<int64_t>& layer : counts) {
    int64_t total = 0;
    for (int64_t c : layer) total += c;
    std::vector<double> fraction;
    for (int64_t c : layer) fraction.push_back(total > 0 ? static_cast<double>(c) / static_cast<double>(total) : 0.0);
    const auto [lo, hi] = std::minmax_element(fraction.begin(), fraction.end());
    layers.push_back({{"assignments", total}, {"fraction", fraction}, {"min", *lo}, {"max", *hi}});
  }
  return layers;
}

}  // namespace mfsdp
