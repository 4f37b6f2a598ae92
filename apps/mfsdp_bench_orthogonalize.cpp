// Benchmark (not a test): ms per call of each orthogonalizer at 5 steps on GPT-2 124M's Muon
// shapes, at the OpenMP thread count of the environment (OMP_NUM_THREADS).
// usage: mfsdp-bench-orthogonalize [REPS] [--tiny]   (--tiny: one 32x48 call per method, for ctest)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "optim/orthogonalize.h"
#include "planner/cost_model.h"

using namespace mfsdp;

int main(int argc, char** argv) {
  int reps = 3;
  bool tiny = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tiny") == 0)
      tiny = true;
    else
      reps = std::max(1, std::atoi(argv[i]));
  }
  std::vector<std::pair<int64_t, int64_t>> shapes = {{768, 768}, {768, 2304}, {768, 3072}, {3072, 768}};
  if (tiny) {
    shapes = {{32, 48}};
    reps = 1;
  }
  const Orthogonalizer methods[] = {Orthogonalizer::newton_schulz5, Orthogonalizer::polar_express,
                                    Orthogonalizer::gram_newton_schulz};
  std::printf("orthogonalize_cpu, 5 steps, %d OpenMP threads, best of %d (ms per call; GFLOP = cost model)\n",
              omp_get_max_threads(), reps);
  std::printf("%-12s %-20s %10s %10s %8s\n", "shape", "method", "ms", "GFLOP", "GFLOP/s");
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto [r, c] : shapes) {
    std::vector<float> g(static_cast<size_t>(r * c)), out(g.size());
    for (float& x : g) x = dist(rng);
    for (Orthogonalizer m : methods) {
      orthogonalize_cpu(g.data(), out.data(), r, c, 5, m);  // warm-up: scratch, caches
      double best = 1e30;
      for (int rep = 0; rep < reps; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        orthogonalize_cpu(g.data(), out.data(), r, c, 5, m);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      const double gflop = orthogonalizer_flops(r, c, 5, m) / 1e9;
      std::printf("%4ldx%-7ld %-20s %10.2f %10.3f %8.1f\n", static_cast<long>(r), static_cast<long>(c),
                  orthogonalizer_name(m), best * 1e3, gflop, gflop / best);
    }
  }
  return 0;
}
