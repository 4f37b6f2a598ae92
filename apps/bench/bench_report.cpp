#include "apps/bench/bench_report.h"

#include <cstdio>

namespace mfsdp {
namespace {

std::string line(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

double mb(const BenchResult& r, CommPhase p) { return r.bytes[static_cast<size_t>(p)] / 1e6; }

}  // namespace

std::string bench_time_table(const std::vector<BenchResult>& results) {
  std::string out = line("%-10s %3s %4s %-13s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "model", "ns", "dt",
                         "placement", "fwd_ms", "bwd_ms", "reduce_ms", "opt_ms", "total_ms", "gather_MB", "reduce_MB",
                         "opt_MB", "expert_MB", "persist", "peak_MiB");
  for (const BenchResult& r : results) {
    const std::string pl = std::string(placement_name(r.c.placement)) + (r.c.expert_parallel ? "+ep" : "") +
                           (r.c.replicas > 1 ? "x" + std::to_string(r.c.replicas) : "");
    out += line("%-10s %3d %4s %-13s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n",
                r.c.model.name.c_str(), r.c.ns_steps, dtype_name(r.c.dtype), pl.c_str(), r.ms[0], r.ms[1], r.ms[2], r.ms[3],
                r.ms[4], mb(r, CommPhase::fwd_gather) + mb(r, CommPhase::bwd_gather), mb(r, CommPhase::grad_reduce),
                mb(r, CommPhase::opt_step), mb(r, CommPhase::experts), r.mib[3], r.mib.back());
  }
  return out;
}

std::string bench_memory_table(const std::vector<BenchResult>& results) {
  std::string out = line("%-10s %-11s", "model", "placement");
  for (const std::string& c : bench_memory_categories()) out += line(" %10.10s", c.c_str());
  out += "\n";
  for (const BenchResult& r : results) {
    if (r.c.ns_steps != results.front().c.ns_steps) continue;  // memory does not depend on NS steps
    out += line("%-10s %-11s", r.c.model.name.c_str(),
                (std::string(placement_name(r.c.placement)) + (r.c.expert_parallel ? "+ep" : "")).c_str());
    for (double v : r.mib) out += line(" %10.1f", v);
    out += "\n";
  }
  return out;
}

nlohmann::json bench_ratios(const std::vector<BenchResult>& results) {
  nlohmann::json out = nlohmann::json::array();
  for (const BenchResult& m : results) {
    if (m.c.placement != Placement::matrixfsdp || m.c.expert_parallel) continue;
    for (const BenchResult& f : results)
      if (f.c.placement == Placement::fsdp2 && f.c.model.name == m.c.model.name && f.c.ns_steps == m.c.ns_steps &&
          f.c.dtype == m.c.dtype && f.world == m.world && f.c.replicas == m.c.replicas)
        out.push_back({{"model", m.c.model.name}, {"ns_steps", m.c.ns_steps}, {"dtype", dtype_name(m.c.dtype)},
                       {"world", m.world}, {"replicas", m.c.replicas},
                       {"optimizer_ratio", m.ms[3] > 0 ? f.ms[3] / m.ms[3] : 0.0},
                       {"step_ratio", m.ms[4] > 0 ? f.ms[4] / m.ms[4] : 0.0}});
  }
  return out;
}

}  // namespace mfsdp
