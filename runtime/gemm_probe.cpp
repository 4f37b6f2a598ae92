// The start-up GEMM probe (see gemm_probe.h).
#include "runtime/gemm_probe.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "runtime/core/clock.h"
#include "runtime/core/dtype.h"
#include "runtime/kernels.h"

namespace mfsdp {
namespace {

double flops(const GemmShape& s) { return 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K); }

/// Seconds of one call of `f`.
double seconds(const std::function<void()>& f) {
  const double t0 = now_seconds();
  f();
  return std::max(now_seconds() - t0, 1e-9);
}

GemmRates measure(const GemmShape& s) {
  Kernels& k = kernels(Device::CPU);
  const size_t a = static_cast<size_t>(s.M * s.K), b = static_cast<size_t>(s.K * s.N), c = static_cast<size_t>(s.M * s.N);
  std::vector<float> A(a, 0.01f), B(b, 0.02f), C(c);
  // bf16 0.01 and 0.02 (0x3C24, 0x3CA4): finite operands, so no special-value slow path is timed.
  const std::vector<uint16_t> A16(a, 0x3C24), B16(b, 0x3CA4);
  return time_f32_bf16(
      flops(s), [&] { k.gemm(false, false, s.M, s.N, s.K, 1.f, A.data(), B.data(), 0.f, C.data()); },
      [&] { k.gemm_bf16(false, false, s.M, s.N, s.K, 1.f, A16.data(), B16.data(), 0.f, C.data()); });
}

}  // namespace

GemmRates time_f32_bf16(double flops, const std::function<void()>& f32, const std::function<void()>& bf16,
                        double budget_s) {
  f32();  // warm-up: first-touch pages, oneDNN's primitives
  bf16();
  double best_f32 = 1e30, best_b16 = 1e30;
  const double t0 = now_seconds();
  for (int i = 0; i < 16 && (i < 3 || now_seconds() - t0 < budget_s); ++i) {
    best_f32 = std::min(best_f32, seconds(f32));
    best_b16 = std::min(best_b16, seconds(bf16));
  }
  return {flops / 1e9 / best_f32, flops / 1e9 / best_b16};
}

GemmShape probe_shape(GemmShape s, double max_flops) {
  s.M = std::max<int64_t>(s.M, 1), s.N = std::max<int64_t>(s.N, 1), s.K = std::max<int64_t>(s.K, 1);
  while (flops(s) > max_flops) {
    int64_t* big = &s.M;
    if (s.N > *big) big = &s.N;
    if (s.K > *big) big = &s.K;
    if (*big <= 64) break;
    *big = std::max<int64_t>(64, *big / 2);
  }
  return s;
}

GemmRates probe_cpu_gemm_rates(GemmShape shape) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t, int>, GemmRates> cache;
  const GemmShape s = probe_shape(shape);
  const auto key = std::make_tuple(s.M, s.N, s.K, cpu_threads());
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache.emplace(key, measure(s)).first->second;
}

std::string describe_rates(const GemmRates& r) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "bf16 %.0f vs f32 %.0f GFLOP/s", r.bf16, r.f32);
  return buf;
}

}  // namespace mfsdp
