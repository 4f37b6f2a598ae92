// Orthogonalizers for Muon-family optimizers: approximate polar factors U V^T of a whole matrix
// G = U S V^T, on raw contiguous f32 buffers (CPU). Three methods, one entry point, plus
// owner-local batching and the per-head split. f32 products: bitwise independent of the OpenMP
// thread count; bf16 products (NsDType::bf16): deterministic for a fixed thread count and ISA.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "optim/muon_options.h"

namespace mfsdp {

/// Which polar-factor approximation an orthogonalization runs (config key `orthogonalizer`).
///
/// newton_schulz5: Keller Jordan's quintic Newton-Schulz (Muon), fixed (a, b, c) =
///   (3.4445, -4.7750, 2.0315), X0 = G / (||G||_F + 1e-7). Does not converge to exact
///   orthogonality: singular values of the result land in about [0.68, 1.13] (more spread for
///   ill-conditioned inputs). Same bits as `newton_schulz_cpu`.
/// polar_express: the same quintic evaluation X <- a_t X + (b_t A + c_t A^2) X, A = X X^T, with
///   per-iteration minimax-optimal coefficients (a_t, b_t, c_t), t = 0..4, from Amsel, Persson,
///   Musco and Gower, "The Polar Express: Optimal Matrix Sign Methods and Their Application to
///   the Muon Algorithm", arXiv 2505.16932 (the 5-iteration table computed with safety factor
///   2e-2 and cushion 2), and X0 = G / (1.02 ||G||_F + 1e-6) (the 1.02 safety factor keeps the
///   spectral norm below 1 so the polynomials stay on the interval they were optimized for).
///   For steps > 5 the last triple is reused (as the paper's reference code does).
/// gram_newton_schulz: the polar_express polynomials (same coefficients, same X0) evaluated on
///   the small Gram matrix (Zhang, Amsel, Chen and Dao, "Gram Newton-Schulz", 2026). With
///   m = min(rows, cols) <= n, X [m, n], R = X X^T [m, m]: each step is X_{t+1} = H_t X_t with
///   H_t = a_t I + Z_t, Z_t = b_t R_t + c_t R_t^2, so X_t = Q_t X_0 with Q_t = H_{t-1}...H_0 and
///   R_{t+1} = H_t R_t H_t. Only m x m products run in the loop (Q <- a Q + Q Z,
///   RZ = a R + R Z, R <- a RZ + Z RZ), and the [m, n] matrix is touched only at restarts and
///   at the end (X <- Q X). Restart rule: before step t = 2, 5, 8, ... (t >= 2, (t - 2) % 3 == 0;
///   for 5 steps only before the third, as in the reference) X <- Q X, R <- X X^T, Q <- I, which
///   bounds the round-off that accumulates in R and Q (spurious negative eigenvalues of R,
///   eigenvector drift). In exact arithmetic it equals polar_express; in f32 it agrees to ~1e-5.
///   Cheaper than polar_express for clearly rectangular matrices (n >= ~1.5 m), dearer for square
///   ones (see `orthogonalizer_flops` in planner/cost_model.h).
///
/// Every method: works on X^T when rows > cols, maps a zero matrix to exactly zero (and keeps
/// zero singular values at zero), runs in f32 with f64 norm accumulation.
// (enum class Orthogonalizer is declared in optim/muon_options.h)


/// One quintic coefficient triple: p(x) = a x + b x^3 + c x^5.
struct QuinticCoeffs {
  double a, b, c;
};

/// The Polar Express table (arXiv 2505.16932; num_iters 5, safety factor 2e-2, cushion 2).
inline constexpr std::array<QuinticCoeffs, 5> kPolarExpressCoeffs = {{
    {8.156554524902461, -22.48329292557795, 15.878769915207462},
    {4.042929935166739, -2.808917465908714, 0.5000178451051316},
    {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
    {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
    {2.3465413258596377, -1.7097828382687081, 0.42323551169305323},
}};
/// Polar Express normalization: X0 = G / (kPolarExpressNormScale * ||G||_F + kPolarExpressNormEps).
inline constexpr double kPolarExpressNormScale = 1.02;
inline constexpr double kPolarExpressNormEps = 1e-6;

/// Coefficients `method` uses at 0-based step `t` (t >= 0): the Newton-Schulz triple for
/// newton_schulz5; kPolarExpressCoeffs[min(t, 4)] for polar_express and gram_newton_schulz.
QuinticCoeffs orthogonalizer_coeffs(Orthogonalizer method, int t);


/// Approximate polar factor of G by `method`, `steps` iterations, in f32 (dtype f32), or with
/// bf16 products (dtype bf16: every product of a quintic step takes bf16-rounded operands with f32
/// accumulation on the CPU's bf16 GEMM; normalization and additions in f32; deterministic for a
/// fixed thread count and ISA; throws std::invalid_argument for gram_newton_schulz).
/// G: [rows, cols] row-major f32, read only. out: [rows, cols] row-major f32 (may equal G).
/// Scratch is thread-local and reused; with dtype f32 every GEMM runs in fixed shape-dependent
/// bands (each one single-threaded GEMM: Eigen's kernel when the smaller side is under 256, oneDNN's
/// SGEMM from 256 on), so results are bitwise independent of the OpenMP thread count (and of the
/// buffers' addresses).
/// steps == 0 returns the normalized input. Increments the Newton-Schulz call counter once
/// (`newton_schulz_call_count` in optim/muon.h).
/// Throws std::invalid_argument for negative sizes or steps, or null buffers with a non-empty shape.
void orthogonalize_cpu(const float* G, float* out, int64_t rows, int64_t cols, int steps,
                       Orthogonalizer method, NsDType dtype = NsDType::f32);

/// `count` independent same-shape orthogonalizations in one call (an owner's matrices of one
/// shape). G[i], out[i]: [rows, cols] row-major f32 each (out[i] may equal G[i]; distinct i must
/// not overlap). Each result equals orthogonalize_cpu on that matrix bit for bit; small matrices
/// run in parallel across the batch. No padding. Counts `count` calls.
/// Throws std::invalid_argument for count < 0, bad shapes/steps or null pointers.
void orthogonalize_batched_cpu(const float* const* G, float* const* out, int64_t count, int64_t rows,
                               int64_t cols, int steps, Orthogonalizer method, NsDType dtype = NsDType::f32);

/// Strided form: matrix i is G + i*rows*cols (one contiguous [count*rows, cols] buffer); out
/// likewise (may equal G). Same guarantees as orthogonalize_batched_cpu.
void orthogonalize_strided_cpu(const float* G, float* out, int64_t count, int64_t rows, int64_t cols,
                               int steps, Orthogonalizer method, NsDType dtype = NsDType::f32);

/// Per-head split of a [rows, cols] matrix whose rows are rows/head_dim heads of head_dim rows
/// each (e.g. a [n_heads*head_dim, C] projection; a fused QKV with head_dim = rows/3 is the
/// split_qkv case): each [head_dim, cols] row block is orthogonalized on its own (bitwise equal to
/// orthogonalize_cpu on that block). head_dim == rows orthogonalizes the whole matrix.
/// Throws std::invalid_argument unless head_dim >= 1 divides rows (plus the checks above).
void orthogonalize_heads_cpu(const float* G, float* out, int64_t rows, int64_t cols, int64_t head_dim,
                             int steps, Orthogonalizer method, NsDType dtype = NsDType::f32);

}  // namespace mfsdp
