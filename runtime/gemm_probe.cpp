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

/// Best of two timed calls after one warm-up (which also builds oneDNN's primitive for the shape).
template <class F>
double best_seconds(F&& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < 2; ++i) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return std::max(best, 1e-9);
}

GemmRates measure(const GemmShape& s) {
  Kernels& k = kernels(Device::CPU);
  const size_t a = static_cast<size_t>(s.M * s.K), b = static_cast<size_t>(s.K * s.N), c = static_cast<size_t>(s.M * s.N);
  std::vector<float> A(a, 0.01f), B(b, 0.02f), C(c);
  // bf16 0.01 and 0.02 (0x3C24, 0x3CA4): finite operands, so no special-value slow path is timed.
  const std::vector<uint16_t> A16(a, 0x3C24), B16(b, 0x3CA4);
  GemmRates r;
  r.f32 = flops(s) / 1e9 / best_seconds([&] { k.gemm(false, false, s.M, s.N, s.K, 1.f, A.data(), B.data(), 0.f, C.data()); });
  r.bf16 = flops(s) / 1e9 /
           best_seconds([&] { k.gemm_bf16(false, false, s.M, s.N, s.K, 1.f, A16.data(), B16.data(), 0.f, C.data()); });
  return r;
}

}  // namespace

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

bool bf16_pays(const GemmRates& r) { return r.f32 > 0 && r.bf16 >= kBf16Margin * r.f32; }

std::string describe_rates(const GemmRates& r) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "bf16 %.0f vs f32 %.0f GFLOP/s", r.bf16, r.f32);
  return buf;
}

}  // namespace mfsdp
