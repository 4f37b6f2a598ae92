// Benchmark (not a test): ms per call of each orthogonalizer at 5 steps on GPT-2 124M's Muon
// shapes, at the OpenMP thread count of the environment (OMP_NUM_THREADS), next to the plain GEMM
// rate of the same products (f32 SGEMM and the bf16 GEMM, the CPU backend's kernels) in this run,
// and ns_dtype auto (the dtype the start-up GEMM probe picks for the shape).
// Then grouped against per-matrix Newton-Schulz for 64 same-shape expert matrices (the shapes of
// qwen2-moe-100m's experts): one orthogonalize_strided_cpu call over the stack against 64
// orthogonalize_cpu calls, f32 and bf16 products.
// usage: mfsdp-bench-orthogonalize [REPS] [--tiny]   (--tiny: 32x48 and 4 experts of 32x48, for ctest)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "optim/ns_probe.h"
#include "optim/orthogonalize.h"
#include "planner/cost_model.h"
#include "runtime/core/dtype.h"
#include "runtime/cpu_gemm_bf16.h"
#include "runtime/gemm_probe.h"
#include "runtime/kernels.h"

using namespace mfsdp;

namespace {

/// Best-of-`reps` seconds of `f` after one warm-up call.
template <class F>
double best_seconds(int reps, F&& f) {
  f();
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

/// GFLOP/s of Newton-Schulz's two large products on an m x n matrix (m <= n): X X^T ([m,n] x [n,m])
/// and B X ([m,m] x [m,n]), as f32 SGEMMs and as bf16 GEMMs with f32 accumulation.
void print_gemm_rates(int64_t m, int64_t n, int reps) {
  std::vector<float> x(static_cast<size_t>(m * n), 0.5f), a(static_cast<size_t>(m * m), 0.25f);
  std::vector<float> c(static_cast<size_t>(std::max(m * m, m * n)));
  std::vector<bf16> xb(x.size(), float_to_bf16(0.5f)), ab(a.size(), float_to_bf16(0.25f));
  Kernels& k = kernels(Device::CPU);
  const double flop = 2.0 * m * m * n * 2;  // both products
  const double f32 = best_seconds(reps, [&] {
    k.gemm(false, true, m, m, n, 1.f, x.data(), x.data(), 0.f, c.data());
    k.gemm(false, false, m, n, m, 1.f, a.data(), x.data(), 0.f, c.data());
  });
  const double b16 = best_seconds(reps, [&] {
    k.gemm_bf16(false, true, m, m, n, 1.f, xb.data(), xb.data(), 0.f, c.data());
    k.gemm_bf16(false, false, m, n, m, 1.f, ab.data(), xb.data(), 0.f, c.data());
  });
  std::printf("%4ldx%-7ld %-20s %10.2f %10.3f %8.1f\n", static_cast<long>(m), static_cast<long>(n),
              "plain gemm f32", f32 * 1e3, flop / 1e9, flop / 1e9 / f32);
  std::printf("%4ldx%-7ld %-20s %10.2f %10.3f %8.1f\n", static_cast<long>(m), static_cast<long>(n),
              "plain gemm bf16", b16 * 1e3, flop / 1e9, flop / 1e9 / b16);
}

/// Grouped (one strided call over `count` matrices) against per-matrix Newton-Schulz, 5 steps.
void print_grouped_rates(int64_t count, int64_t r, int64_t c, int reps) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(count * r * c)), out(g.size());
  for (float& x : g) x = dist(rng);
  const double gflop = count * orthogonalizer_flops(r, c, 5, Orthogonalizer::newton_schulz5) / 1e9;
  for (NsDType dt : {NsDType::f32, NsDType::bf16}) {
    const double one = best_seconds(reps, [&] {
      for (int64_t i = 0; i < count; ++i)
        orthogonalize_cpu(g.data() + i * r * c, out.data() + i * r * c, r, c, 5, Orthogonalizer::newton_schulz5, dt);
    });
    const double grouped = best_seconds(reps, [&] {
      orthogonalize_strided_cpu(g.data(), out.data(), count, r, c, 5, Orthogonalizer::newton_schulz5, dt);
    });
    std::printf("%3ld x %4ldx%-5ld %-5s %12.2f %12.2f %8.2fx %10.1f\n", static_cast<long>(count), static_cast<long>(r),
                static_cast<long>(c), ns_dtype_name(dt), one * 1e3, grouped * 1e3, one / grouped, gflop / grouped);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  bool tiny = false;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long v = std::strtol(argv[i], &end, 10);
    if (std::strcmp(argv[i], "--tiny") == 0) {
      tiny = true;
    } else if (end != argv[i] && *end == '\0' && v >= 1 && v <= 1000) {
      reps = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "mfsdp-bench-orthogonalize: expected [--tiny] [repetitions 1..1000], got '%s'\n", argv[i]);
      return 2;
    }
  }
  std::vector<std::pair<int64_t, int64_t>> shapes = {{768, 768}, {768, 2304}, {768, 3072}, {3072, 768}};
  if (tiny) {
    shapes = {{32, 48}};
    reps = 1;
  }
  const Orthogonalizer methods[] = {Orthogonalizer::newton_schulz5, Orthogonalizer::polar_express,
                                    Orthogonalizer::gram_newton_schulz};
  std::printf("orthogonalize_cpu, 5 steps, %d OpenMP threads, best of %d (ms per call; GFLOP = cost model); "
              "plain gemm: X X^T and B X once each (%s)\n",
              omp_get_max_threads(), reps, cpu_gemm_bf16_path());
  std::printf("%-12s %-20s %10s %10s %8s\n", "shape", "method", "ms", "GFLOP", "GFLOP/s");
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto [r, c] : shapes) {
    std::vector<float> g(static_cast<size_t>(r * c)), out(g.size());
    for (float& x : g) x = dist(rng);
    print_gemm_rates(std::min(r, c), std::max(r, c), reps);
    for (Orthogonalizer m : methods) {
      const double best = best_seconds(reps, [&] { orthogonalize_cpu(g.data(), out.data(), r, c, 5, m); });
      const double gflop = orthogonalizer_flops(r, c, 5, m) / 1e9;
      std::printf("%4ldx%-7ld %-20s %10.2f %10.3f %8.1f\n", static_cast<long>(r), static_cast<long>(c),
                  orthogonalizer_name(m), best * 1e3, gflop, gflop / best);
      if (m == Orthogonalizer::gram_newton_schulz) continue;  // f32 only
      // ns_dtype bf16: the same iterations with bf16 products (f32 accumulation). GFLOP is the
      // cost model's f32 count (the bf16 path computes the symmetric products in full).
      const double best_bf16 = best_seconds(
          reps, [&] { orthogonalize_cpu(g.data(), out.data(), r, c, 5, m, NsDType::bf16); });
      const std::string name = std::string(orthogonalizer_name(m)) + " bf16";
      std::printf("%4ldx%-7ld %-20s %10.2f %10.3f %8.1f\n", static_cast<long>(r), static_cast<long>(c),
                  name.c_str(), best_bf16 * 1e3, gflop, gflop / best_bf16);
      // ns_dtype auto: the dtype the start-up probe (one step at this shape) picks, timed again
      const GemmRates probe = probe_orthogonalizer_rates(r, c, m);
      const NsDType pick = bf16_pays(probe, kBf16StepMargin) ? NsDType::bf16 : NsDType::f32;
      const double best_auto = best_seconds(reps, [&] { orthogonalize_cpu(g.data(), out.data(), r, c, 5, m, pick); });
      const std::string auto_name = std::string(orthogonalizer_name(m)) + " auto=" + ns_dtype_name(pick);
      std::printf("%4ldx%-7ld %-20s %10.2f %10.3f %8.1f   (probe: %s)\n", static_cast<long>(r), static_cast<long>(c),
                  auto_name.c_str(), best_auto * 1e3, gflop, gflop / best_auto, describe_rates(probe).c_str());
    }
  }
  const int64_t experts = tiny ? 4 : 64;
  const std::vector<std::pair<int64_t, int64_t>> expert_shapes =
      tiny ? std::vector<std::pair<int64_t, int64_t>>{{32, 48}} : std::vector<std::pair<int64_t, int64_t>>{{256, 512}, {512, 256}};
  std::printf("\ngrouped Newton-Schulz (newton_schulz5, 5 steps), %d OpenMP threads, best of %d: ms per stack\n",
              omp_get_max_threads(), reps);
  std::printf("%-20s %-5s %12s %12s %9s %10s\n", "stack", "dtype", "per-matrix", "grouped", "speed-up", "GFLOP/s");
  for (auto [r, c] : expert_shapes) print_grouped_rates(experts, r, c, reps);
  return 0;
}
