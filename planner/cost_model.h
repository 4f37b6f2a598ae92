// The optimizer cost model used for owner balance and for projecting cluster-scale step cost.
#pragma once
#include <cstdint>

#include "optim/muon_options.h"  // the Orthogonalizer enum only (no link dependency)
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

/// FLOPs of one orthogonalization of a rows x cols matrix by `method` for `steps` iterations,
/// counted as general GEMMs (2*M*N*K per product, like muon_flops; the CPU kernels compute the
/// symmetric m x m products as triangles, which halves those for every method alike).
/// m = min(rows, cols), n = max(rows, cols) (tall matrices are transposed):
///   newton_schulz5, polar_express: steps * (4*m*m*n + 2*m*m*m)  (== muon_flops; same evaluation)
///   gram_newton_schulz, steps s >= 1 with r restarts (r = #{t in [1, s-1] : restart before t},
///   t = 2, 5, 8, ...; r = 1 for s = 5):
///     R0 = X X^T                         2*m*m*n
///     each step: Z = b R + c R R          2*m^3            (s times)
///     Q <- a Q + Q Z                      2*m^3            (s - r - 1 times: not on a segment's first step)
///     RZ = a R + R Z, R <- a RZ + Z RZ    4*m^3            (s - r - 1 times: not on a segment's last step)
///     each restart: X <- Q X, R <- X X^T  4*m*m*n          (r times)
///     final X <- Q X                      2*m*m*n
///   total = (4 + 4r)*m*m*n + (2s + 6(s - r - 1))*m^3; s = 0 costs 0. For s = 5: 8 m^2 n + 28 m^3
///   versus 20 m^2 n + 10 m^3 for the standard evaluation: fewer FLOPs once n > 1.5 m
///   (768x3072: 60 m^3 vs 90 m^3), more for square matrices (36 m^3 vs 30 m^3).
/// Elementwise work is O(m*n + m*m) per step and left out.
/// Throws std::invalid_argument when rows or cols < 1 or steps < 0.
double orthogonalizer_flops(int64_t rows, int64_t cols, int steps, Orthogonalizer method);

/// Muon FLOPs of a shard: blocks * orthogonalizer_flops(rows / blocks, cols, options.ns_steps,
/// options.orthogonalizer), with blocks = rows / options.head_dim when options.head_dim > 0 and
/// qkv_blocks > 1 (per-head split), else qkv_blocks when options.split_qkv and qkv_blocks > 1,
/// else 1. 0 for AdamW tensors. Throws std::invalid_argument when the blocks do not divide rows.
double shard_muon_flops(const MatrixShard& s, const PlannerOptions& options);

/// kAdamWFlopsPerElement * numel.
double adamw_flops(int64_t numel);

/// Optimizer state elements per parameter element: Muon 1 (momentum), AdamW 2 (m and v).
int64_t state_per_element(OptimizerKind k);

/// Bytes per parameter element resident between steps on its owner: param + grad + state, f32.
/// Muon 12, AdamW 16.
int64_t owner_bytes_per_element(OptimizerKind k);

}  // namespace mfsdp
