// The CPUs this process may run on, and the thread count that follows from them. A launcher may
// bind each rank to a subset of the machine (Open MPI binds each rank to one core when it starts two
// ranks or fewer); threads beyond that subset share its cores and only slow the rank down.
#pragma once
#include <sched.h>

#include <algorithm>
#include <string>
#include <thread>

namespace mfsdp {

/// Most CPU threads any tool takes (--threads of mfsdp-train, mfsdp-prepare, the benchmarks):
/// beyond any machine, and OpenMP runtimes fail in their own way far above it.
inline constexpr int kMaxCpuThreads = 1024;

/// The CPUs of this process's affinity mask (sched_getaffinity), as a count and as a list such as
/// "0-3,8". Falls back to the machine's core count when the mask cannot be read.
struct CpuAffinity {
  int count = 1;
  std::string list;
};

inline CpuAffinity cpu_affinity() {
  CpuAffinity a;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    a.count = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    a.list = "unknown";
    return a;
  }
  a.count = std::max(1, CPU_COUNT(&set));
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int end = c;
    while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set)) ++end;
    a.list += (a.list.empty() ? "" : ",") + std::to_string(c) + (end > c ? "-" + std::to_string(end) : "");
    c = end;
  }
  return a;
}

/// The default CPU threads of a rank: every CPU of its affinity mask when the launcher bound it to
/// a subset of the machine; otherwise (unbound ranks see the whole machine) the machine's CPUs
/// divided by `ranks_on_machine`, the ranks that share it. At least 1.
inline int default_cpu_threads(int ranks_on_machine) {
  const int allowed = cpu_affinity().count;
  const int machine = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (allowed < machine) return allowed;
  return std::max(1, allowed / std::max(1, ranks_on_machine));
}

/// Empty when `threads` fit the affinity mask; otherwise the error a rank reports before training
/// (threads beyond the mask time-share its cores: the run is slower, and the thread count is part
/// of what makes runs bitwise reproducible, so it is not lowered silently).
inline std::string check_cpu_threads(int threads) {
  const CpuAffinity a = cpu_affinity();
  if (threads <= a.count) return "";
  return "--threads " + std::to_string(threads) + " asks for more threads than the " + std::to_string(a.count) +
         " CPU(s) this rank may run on (CPUs " + a.list + "): the launcher bound it. Launch with " +
         "`mpirun --bind-to none` (ranks share the machine) or `mpirun --map-by slot:PE=" + std::to_string(threads) +
         "` (each rank gets " + std::to_string(threads) + " cores), or pass --threads " + std::to_string(a.count);
}

}  // namespace mfsdp
