#include "planner/cost_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mfsdp {

double muon_flops(int64_t rows, int64_t cols, int ns_steps) {
  if (rows < 1 || cols < 1 || ns_steps < 0)
    throw std::invalid_argument("[muon_flops] need rows >= 1, cols >= 1, ns_steps >= 0; got rows " +
                                std::to_string(rows) + ", cols " + std::to_string(cols) +
                                ", ns_steps " + std::to_string(ns_steps));
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(ns_steps) * (4.0 * m * m * n + 2.0 * m * m * m);
}

double orthogonalizer_flops(int64_t rows, int64_t cols, int steps, Orthogonalizer method) {
  if (rows < 1 || cols < 1 || steps < 0)
    throw std::invalid_argument("[orthogonalizer_flops] need rows >= 1, cols >= 1, steps >= 0; got rows " +
                                std::to_string(rows) + ", cols " + std::to_string(cols) + ", steps " +
                                std::to_string(steps));
  if (method != Orthogonalizer::gram_newton_schulz) return muon_flops(rows, cols, steps);
  if (steps == 0) return 0.0;
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  int restarts = 0;
  for (int t = 1; t < steps; ++t) restarts += gram_newton_schulz_restarts_before(t) ? 1 : 0;
  const double s = steps, r = restarts;
  return (4.0 + 4.0 * r) * m * m * n + (2.0 * s + 6.0 * (s - r - 1.0)) * m * m * m;
}

double shard_muon_flops(const MatrixShard& s, const PlannerOptions& options) {
  if (s.optimizer != OptimizerKind::muon) return 0.0;
  if (s.shape.size() != 2)
    throw std::invalid_argument("[shard_muon_flops] " + s.name + " is routed to Muon but has " +
                                std::to_string(s.shape.size()) + " dims");
  const int64_t rows = s.shape[0], cols = s.shape[1];
  int64_t blocks = 1;
  if (options.head_dim > 0 && s.qkv_blocks > 1) {
    if (rows % s.qkv_blocks != 0 || (rows / s.qkv_blocks) % options.head_dim != 0)
      throw std::invalid_argument("[shard_muon_flops] " + s.name + ": head_dim " + std::to_string(options.head_dim) +
                                  " does not divide the " + std::to_string(s.qkv_blocks) + " blocks of rows " +
                                  std::to_string(rows));
    blocks = rows / options.head_dim;
  } else if (options.split_qkv && s.qkv_blocks > 1) {
    if (rows % s.qkv_blocks != 0)
      throw std::invalid_argument("[shard_muon_flops] " + s.name + ": qkv_blocks " +
                                  std::to_string(s.qkv_blocks) + " does not divide rows " +
                                  std::to_string(rows));
    blocks = s.qkv_blocks;
  }
  return static_cast<double>(blocks) *
         orthogonalizer_flops(rows / blocks, cols, options.ns_steps, options.orthogonalizer);
}

double adamw_flops(int64_t numel) { return kAdamWFlopsPerElement * static_cast<double>(numel); }

int64_t state_per_element(OptimizerKind k) { return k == OptimizerKind::muon ? 1 : 2; }

int64_t owner_bytes_per_element(OptimizerKind k) {
  return (2 + state_per_element(k)) * kF32Bytes;
}

}  // namespace mfsdp
