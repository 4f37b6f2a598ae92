// Muon: momentum + Newton-Schulz orthogonalization of whole 2D weight matrices.
// CPU kernels on raw contiguous f32 buffers; the sharding engine calls them on the matrices it owns.
#pragma once
#include <cstdint>
#include <string>

#include "optim/muon_options.h"
#include "optim/normuon.h"
#include "optim/orthogonalize.h"

namespace mfsdp {



/// Quintic Newton-Schulz coefficients (a, b, c) of Keller Jordan's Muon.
inline constexpr float kNewtonSchulzA = 3.4445f;
inline constexpr float kNewtonSchulzB = -4.7750f;
inline constexpr float kNewtonSchulzC = 2.0315f;
/// Added to the Frobenius norm before normalizing (keeps a zero input at zero, never NaN).
inline constexpr float kNewtonSchulzNormEps = 1e-7f;

/// Newton-Schulz orthogonalization in f32 (reference: Keller Jordan's Muon, `zeropower_via_newtonschulz5`).
/// G: [rows, cols] row-major f32, read only. out: [rows, cols] row-major f32 (may equal G).
/// X = G / (||G||_F + 1e-7) (norm accumulated in f64); when rows > cols the iteration runs on X^T;
/// `steps` times: A = X X^T; B = b*A + c*A A; X = a*X + B X. Works on private (thread-local,
/// reused) scratch; A and A A are computed as lower triangles (symmetric), all GEMMs in fixed
/// shape-dependent bands under OpenMP (all of omp_get_max_threads()), each band one single-threaded
/// GEMM over the whole K (never Eigen's own parallelizer, whatever Eigen::setNbThreads says), so the
/// result is bitwise independent of the thread count. 768x3072, 5 steps: ~0.15 s on 2 idle cores
/// (~0.28 s on one). Increments the process call counter.
/// Throws std::invalid_argument for negative sizes/steps or null pointers with a non-empty shape.
void newton_schulz_cpu(const float* G, float* out, int64_t rows, int64_t cols, int steps);

/// Scale factor of the update of a [rows, cols] matrix (block) under `rule`:
/// original = sqrt(max(1, rows/cols)), match_rms_adamw = 0.2*sqrt(max(rows, cols)).
/// Throws std::invalid_argument when rows or cols is not positive.
double muon_scale(int64_t rows, int64_t cols, MuonScaleRule rule);

/// One Muon step on one whole matrix. W, G, M: [rows, cols] row-major f32 (weight, gradient, momentum).
///   M <- beta*M + (1-beta)*G;  U = nesterov ? (1-beta)*G + beta*M : M;
///   O = orthogonalize(U) by opt.orthogonalizer, or, when opt.split_qkv and qkv_blocks > 1, of each
///   block of rows/qkv_blocks rows (head_dim rows with opt.split_heads);
///   W <- W*(1 - lr*wd);  W <- W - lr*scale*O  (scale from the block shape).
/// U and O live in private scratch (the momentum is never overwritten by Newton-Schulz).
/// A zero G and M give a zero update (only the weight decay acts). Newton-Schulz runs once per
/// matrix (qkv_blocks times when split). Throws std::invalid_argument for bad shapes/options
/// (e.g. rows not divisible by qkv_blocks, momentum outside [0, 1), variant normuon).
void muon_step_cpu(float* W, const float* G, float* M, int64_t rows, int64_t cols, double lr,
                   const MuonOptions& opt, int qkv_blocks = 1);

/// The elementwise first half of a Muon step, on any contiguous piece of a matrix (the fsdp2
/// baseline runs it on its row shard): M <- beta*M + (1-beta)*G; U = nesterov ? (1-beta)*G + beta*M : M.
/// G, M, U: n f32 each (U may alias G). Same float arithmetic as muon_step_cpu.
void muon_momentum_cpu(const float* G, float* M, float* U, int64_t n, const MuonOptions& opt);
/// The elementwise last half: W <- W*(1 - lr*wd) - lr*scale*O over n elements.
void muon_apply_update_cpu(float* W, const float* O, int64_t n, double lr, double scale, double weight_decay);

/// Number of Newton-Schulz invocations (CPU and CUDA) in this process since start or the last reset.
int64_t newton_schulz_call_count();
/// Resets the Newton-Schulz invocation counter to 0.
void reset_newton_schulz_call_count();

namespace detail {
/// Increments the Newton-Schulz call counter (used by the CPU and CUDA implementations).
void count_newton_schulz_call();
/// Throws std::invalid_argument unless the options are usable (names `op` in the message).
void validate_muon_options(const MuonOptions& opt, const char* op);
/// Number of row blocks muon_step_* orthogonalizes separately: 1, qkv_blocks (split_qkv), or
/// rows / head_dim (split_heads, when qkv_blocks > 1); validates that the blocks divide rows.
int64_t muon_block_count(int64_t rows, int64_t cols, const MuonOptions& opt, int qkv_blocks,
                         const char* op);
}  // namespace detail

}  // namespace mfsdp
