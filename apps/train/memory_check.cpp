#include "apps/train/memory_check.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "apps/train/trainer.h"
#include "runtime/core/format_bytes.h"
#include "runtime/core/meminfo.h"
#include "runtime/cuda/device_api.h"

namespace mfsdp {
namespace fs = std::filesystem;
namespace {

// A cgroup file's number; none for "max", a v1 "no limit" (2^63 rounded to pages) or a missing file.
std::optional<double> cgroup_number(const fs::path& p) {
  std::ifstream f(p);
  std::string word;
  if (!(f >> word) || word == "max") return std::nullopt;
  try {
    const double v = std::stod(word);
    return v < 0x1p60 ? std::optional<double>(v) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The tightest memory limit along the process's cgroup path (the job's budget), or none.
std::optional<double> cgroup_limit(std::string& source) {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  std::optional<double> best;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const bool v2 = controllers.empty();
    if (!v2 && ("," + controllers + ",").find(",memory,") == std::string::npos) continue;
    const fs::path root = v2 ? fs::path("/sys/fs/cgroup") : fs::path("/sys/fs/cgroup/memory");
    const char* limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    for (fs::path dir = root / fs::path(path).relative_path();; dir = dir.parent_path()) {
      if (const auto limit = cgroup_number(dir / limit_file); limit && (!best || *limit < *best)) {
        best = *limit;
        source = std::string(v2 ? "cgroup v2 memory.max " : "cgroup v1 memory.limit_in_bytes ") + format_bytes(*limit);
      }
      if (dir.string().size() <= root.string().size()) break;
    }
  }
  return best;
}

std::string largest_terms(const MemoryPlan& m) {
  std::string s;
  auto t = m.terms();
  std::stable_sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  for (size_t i = 0; i < std::min<size_t>(3, t.size()); ++i)
    s += (i ? ", " : "") + t[i].first + " " + format_bytes(t[i].second);
  return s;
}

// What would fit instead, each with its planned total per rank.
std::string what_would_fit(const TrainConfig& cfg, const ShardPlan& plan, const MemoryModel& model,
                           const MemoryPlanOptions& opts, double available,
                           const std::function<ShardPlan(Placement, int)>& replan) {
  const double process = cfg.runtime.device == Device::CPU ? kCpuProcessBytes : 0.0;
  const auto need = [&](const MemoryPlan& m) { return memory_needed(m.total(), process); };
  std::vector<std::string> fits, other;
  auto consider = [&](const std::string& what, const ShardPlan& p, const MemoryPlanOptions& o) {
    const MemoryPlan m = plan_memory_worst(p, model, o);
    (need(m) <= available ? fits : other).push_back(what + ": " + format_bytes(m.total()));
  };
  for (const Placement pl : {Placement::matrixfsdp, Placement::fsdp2, Placement::zero1, Placement::ddp})
    if (pl != plan.placement) consider("sharding.placement=" + std::string(placement_name(pl)), replan(pl, plan.world_size), opts);
  if (!opts.recompute) {
    MemoryPlanOptions o = opts;
    o.recompute = true;
    consider("training.recompute=block", plan, o);
  }
  if (opts.micro_batch > 1) {
    MemoryPlanOptions o = opts;
    o.micro_batch = opts.micro_batch / 2;
    consider("training.micro_batch_size=" + std::to_string(o.micro_batch), plan, o);
  }
  consider(std::to_string(2 * plan.world_size) + " ranks", replan(plan.placement, 2 * plan.world_size), opts);
  std::string s = fits.empty() ? "nothing tried fits" : "would fit: ";
  for (size_t i = 0; i < fits.size(); ++i) s += (i ? "; " : "") + fits[i];
  if (!other.empty()) {
    s += " (too large too: ";
    for (size_t i = 0; i < other.size(); ++i) s += (i ? "; " : "") + other[i];
    s += ")";
  }
  return s;
}

}  // namespace

RankMemory rank_memory_available(Device device, int local_ranks) {
  RankMemory r;
  if (device == Device::CUDA) {
    int64_t free_b = 0, total_b = 0;
    cuda::memory_info(free_b, total_b);
    r.bytes = static_cast<double>(free_b);
    r.source = "free on the GPU (" + format_bytes(static_cast<double>(total_b)) + " in all)";
    return r;
  }
  std::string cg;
  const std::optional<double> limit = cgroup_limit(cg), avail = meminfo_bytes("MemAvailable");
  if (!limit && !avail) return r;
  const double node = std::min(limit.value_or(1e30), avail.value_or(1e30));
  r.source = limit && *limit <= avail.value_or(1e30) ? cg : "MemAvailable " + format_bytes(*avail);
  local_ranks = std::max(local_ranks, 1);
  r.bytes = node / local_ranks;
  if (local_ranks > 1) r.source += ", / " + std::to_string(local_ranks) + " ranks on the node";
  return r;
}

MemoryPlanOptions memory_plan_options(const TrainConfig& cfg, const ResolvedOptions& resolved, DType matmul) {
  MemoryPlanOptions o;
  o.micro_batch = cfg.training.micro_batch_size;
  o.seq = cfg.model.seq_len;
  o.param_dtype = resolved.options.param_dtype;
  o.compute_dtype = matmul;
  o.recompute = resolved.options.recompute_units;
  o.prefetch_depth = resolved.prefetch_depth();
  o.overlap_reduce = resolved.overlap_reduce();
  o.batch_orthogonalize = resolved.batch_orthogonalize();
  return o;
}

MemoryPlan check_memory_plan(const TrainConfig& cfg, Communicator& comm, Communicator* replicas, const ShardPlan& plan,
                             const MemoryModel& model, const MemoryPlanOptions& opts, int local_ranks,
                             const std::function<ShardPlan(Placement, int world)>& replan) {
  const MemoryPlan mine = plan_memory(plan, model, opts, comm.rank());
  int worst_rank = 0;
  const MemoryPlan worst = plan_memory_worst(plan, model, opts, &worst_rank);
  const bool lead = comm.rank() == 0 && (!replicas || replicas->rank() == 0);
  const bool check = cfg.sharding.memory_check != MemoryCheck::off;
  RankMemory avail;  // unknown (0) when the probe fails: this rank then counts as fitting
  if (check) {
    try {
      avail = rank_memory_available(cfg.runtime.device, local_ranks);
    } catch (const std::exception& e) {
      avail.source = e.what();
    }
  }
  const double overhead = cfg.runtime.device == Device::CPU ? kCpuProcessBytes : 0.0;
  const double need = memory_needed(mine.total(), overhead);
  if (lead)
    spdlog::info("memory plan: {} persistent + {} peak transient per rank (rank {}; largest: {}){}", format_bytes(worst.persistent()),
                 format_bytes(worst.transient()), worst_rank, largest_terms(worst),
                 avail.bytes > 0 ? "; " + format_bytes(avail.bytes) + " available per rank (" + avail.source + ")"
                                 : check ? "; available memory unknown, not checked" : "; not checked (sharding.memory_check=off)");
  if (!check) return mine;
  const bool short_here = avail.bytes > 0 && need > avail.bytes;  // every rank joins the agreement below
  double any_short = short_here ? 1.0 : 0.0;  // a scalar: no weights have moved yet
  any_short = comm.all_reduce_scalar(any_short, ReduceOp::max, CommPhase::other);
  if (replicas) any_short = replicas->all_reduce_scalar(any_short, ReduceOp::max, CommPhase::other);
  if (any_short == 0) return mine;
  const std::string message =
      short_here
          ? "the memory plan does not fit: rank " + std::to_string(comm.rank()) + " needs " + format_bytes(mine.total()) +
                " (+" + std::to_string(static_cast<int>(kMemoryPlanMargin * 100)) + "% margin" +
                (overhead > 0 ? " + " + format_bytes(overhead) + " for the process" : "") + ") under sharding.placement=" +
                placement_name(plan.placement) + " at " + std::to_string(plan.world_size) + " ranks, " +
                format_bytes(avail.bytes) + " available (" + avail.source + "); largest terms: " + largest_terms(mine) +
                "; " + what_would_fit(cfg, plan, model, opts, avail.bytes, replan) +
                ". sharding.memory_check=warn runs anyway"
          : "another rank's memory plan does not fit (see its message)";
  if (cfg.sharding.memory_check == MemoryCheck::error) throw InputError(message);
  if (short_here) spdlog::warn("[warning] rank {}: {}", comm.rank(), message);
  return mine;
}

}  // namespace mfsdp
