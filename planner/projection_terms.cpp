#include "planner/projection_terms.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "planner/projection.h"

namespace mfsdp {

double curve_efficiency(const std::vector<std::pair<double, double>>& points, double size) {
  if (points.empty()) return 1.0;
  for (size_t i = 0; i < points.size(); ++i) {
    if (!(points[i].second > 0 && points[i].second <= 1.5))
      throw std::invalid_argument("gemm curve: efficiency " + std::to_string(points[i].second) + " not in (0, 1.5]");
    if (i > 0 && !(points[i].first > points[i - 1].first))
      throw std::invalid_argument("gemm curve: sizes must increase");
  }
  if (size <= points.front().first) return points.front().second;
  if (size >= points.back().first) return points.back().second;
  size_t i = 1;
  while (points[i].first < size) ++i;
  const auto [s0, e0] = points[i - 1];
  const auto [s1, e1] = points[i];
  const double t = std::log2(size / s0) / std::log2(s1 / s0);
  return e0 + t * (e1 - e0);
}

double gemm_seconds(const ClusterSpec& c, DType dtype, double batch, double M, double N, double K, double share) {
  if (dtype != DType::bf16 && dtype != DType::f32)
    throw std::invalid_argument(std::string("projection: dtype must be bf16 or f32, got '") + dtype_name(dtype) + "'");
  const bool bf16 = dtype == DType::bf16;
  const double rate = (bf16 ? c.gemm_tflops_bf16 : c.gemm_tflops_f32) * 1e12 * share;
  const double flops = 2.0 * M * N * K * batch;
  const double size = std::cbrt(M * N * K * batch);
  const double eff = curve_efficiency(bf16 ? c.gemm_curve_bf16 : c.gemm_curve_f32, size);
  const double bytes = (M * K + K * N + M * N) * batch * static_cast<double>(dtype_size(dtype));
  return std::max(flops / (rate * eff), bytes / (c.mem_GBps * 1e9 * share)) + c.launch_us * 1e-6;
}

double newton_schulz_seconds(const ClusterSpec& c, DType dtype, int64_t rows, int64_t cols,
                             int steps, int count, bool batched, double share) {
  if (steps <= 0 || count <= 0) return 0.0;
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  const double b = batched ? count : 1.0;
  const double gemms = gemm_seconds(c, dtype, b, m, m, n, share) + gemm_seconds(c, dtype, b, m, m, m, share) +
                       gemm_seconds(c, dtype, b, m, n, m, share);
  const double launch = c.launch_us * 1e-6;
  const double chain = kNsNormalizeLaunches * launch +
                       steps * (gemms / c.ns_efficiency + kNsExtraLaunchesPerIteration * launch);
  return batched ? chain : chain * count;
}

namespace {

// The communication stream: collectives run one after another in issue order.
struct CommStream {
  double free = 0;
  double run(double issued, double seconds) {
    free = std::max(free, issued) + seconds;
    return free;
  }
};

}  // namespace

UnitSchedule schedule_units(const std::vector<UnitTimes>& units, int prefetch_depth, bool overlap_reduce) {
  const int U = static_cast<int>(units.size()), d = std::max(0, prefetch_depth);
  UnitSchedule s;
  CommStream comm;
  double t = 0;
  std::vector<double> ready(static_cast<size_t>(U), -1.0);
  auto gather = [&](int u, double at) {
    if (u >= 0 && u < U && ready[static_cast<size_t>(u)] < 0)
      ready[static_cast<size_t>(u)] = comm.run(at, units[static_cast<size_t>(u)].gather);
  };
  for (int u = 0; u < U; ++u) {
    gather(u, t);
    t = std::max(t, ready[static_cast<size_t>(u)]);
    for (int v = u + 1; v <= u + d; ++v) gather(v, t);
    t += units[static_cast<size_t>(u)].forward;
  }
  s.forward = t;
  std::fill(ready.begin(), ready.end(), -1.0);
  std::vector<double> reduced(static_cast<size_t>(U), 0.0);
  auto wait = [&](double until) {
    if (until > t) s.reduce_wait += until - t, t = until;
  };
  for (int u = U - 1; u >= 0; --u) {
    gather(u, t);
    t = std::max(t, ready[static_cast<size_t>(u)]);
    for (int v = u - 1; v >= u - d; --v) gather(v, t);
    t += units[static_cast<size_t>(u)].backward;
    reduced[static_cast<size_t>(u)] = comm.run(t, units[static_cast<size_t>(u)].reduce);
    if (!overlap_reduce) wait(reduced[static_cast<size_t>(u)]);
    else if (u + 1 < U) wait(reduced[static_cast<size_t>(u + 1)]);
  }
  if (U > 0) wait(reduced[0]);
  s.backward = t - s.forward - s.reduce_wait;
  return s;
}

}  // namespace mfsdp
