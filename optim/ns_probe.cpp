// The Newton-Schulz dtype probe (see ns_probe.h).
#include "optim/ns_probe.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "optim/orthogonalize.h"
#include "runtime/gemm_probe.h"
#include "runtime/kernels.h"

namespace mfsdp {

double ns_step_flops(int64_t rows, int64_t cols) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  return 4 * m * m * n + 2 * m * m * m;
}

GemmRates probe_orthogonalizer_rates(int64_t rows, int64_t cols, Orthogonalizer method) {
  if (method == Orthogonalizer::gram_newton_schulz)
    throw std::invalid_argument("[ns_probe] gram_newton_schulz has no bf16 products to probe");
  if (rows < 1 || cols < 1) throw std::invalid_argument("[ns_probe] sides must be >= 1");
  while (ns_step_flops(rows, cols) > 1.1e9 && std::min(rows, cols) / 2 >= 256) rows /= 2, cols /= 2;
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int, int>, GemmRates> cache;
  const auto key = std::make_tuple(rows, cols, static_cast<int>(method), cpu_threads());
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<float> g(static_cast<size_t>(rows * cols)), out(g.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (float& x : g) x = dist(rng);
  const GemmRates r = time_f32_bf16(
      ns_step_flops(rows, cols), [&] { orthogonalize_cpu(g.data(), out.data(), rows, cols, 1, method, NsDType::f32); },
      [&] { orthogonalize_cpu(g.data(), out.data(), rows, cols, 1, method, NsDType::bf16); }, 0.03);
  return cache.emplace(key, r).first->second;
}

}  // namespace mfsdp
