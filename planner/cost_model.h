// The optimizer cost model used for owner balance and for projecting cluster-scale step cost.
#pragma once
#include <cstdint>

#include "planner/shard_plan.h"

namespace mfsdp {

/// Bytes of one f32 element.
inline constexpr int64_t kF32Bytes = 4;
/// Rough FLOPs of one AdamW element update (moments 7, bias correction 2, sqrt/eps/div 3,
/// decoupled weight decay 2, apply 2). AdamW is elementwise, so its cost is linear in numel.
inline constexpr double kAdamWFlopsPerElement = 16.0;

/// Newton-Schulz FLOPs of a rows x cols matrix for `ns_steps` iterations.
/// With m = min(rows, cols), n = max(rows, cols) (tall matrices are transposed), one quintic
/// iteration computes A = X X^T (2*m*m*n), A*A (2*m*m*m) and B X (2*m*m*n):
///   muon_flops = ns_steps * (4*m*m*n + 2*m*m*m)
/// Elementwise work (normalization, momentum, apply) is O(m*n) and left out.
/// Throws std::invalid_argument when rows or cols < 1 or ns_steps < 0.
double muon_flops(int64_t rows, int64_t cols, int ns_steps);

/// Muon FLOPs of a shard: muon_flops of its [rows, cols], or, when options.split_qkv is set and
/// qkv_blocks > 1, qkv_blocks * muon_flops(rows / qkv_blocks, cols). 0 for AdamW tensors.
double shard_muon_flops(const MatrixShard& s, const PlannerOptions& options);

/// kAdamWFlopsPerElement * numel.
double adamw_flops(int64_t numel);

/// Optimizer state elements per parameter element: Muon 1 (momentum), AdamW 2 (m and v).
int64_t state_per_element(OptimizerKind k);

/// Bytes per parameter element resident between steps on its owner: param + grad + state, f32.
/// Muon 12, AdamW 16.
int64_t owner_bytes_per_element(OptimizerKind k);

}  // namespace mfsdp
