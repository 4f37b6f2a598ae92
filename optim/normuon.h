// NorMuon: neuron-wise (per-row) second-moment normalization of an orthogonalized Muon update.
// Li, Liu, Liang, Chen and Zhao, "NorMuon: Making Muon more efficient and scalable",
// arXiv 2510.05491 (Algorithm 1).
#pragma once
#include <cstdint>
#include <string>

#include "optim/muon_options.h"

namespace mfsdp {


/// RMS of the NorMuon update: Algorithm 1's learning rate eta_hat = 0.2 * eta * sqrt(m n) / ||O_hat||_F
/// applied to O_hat is eta times an update of RMS exactly 0.2 (Adam-like update RMS).
inline constexpr double kNorMuonUpdateRms = 0.2;

/// NorMuon normalization of an orthogonalized block, in place (arXiv 2510.05491, Algorithm 1):
///   v_i   <- beta2 * v_i + (1 - beta2) * mean_j(O_ij^2)           (per row = per output neuron)
///   Oh_ij  = O_ij / (sqrt(v_i) + eps)
///   O_ij  <- target_rms * sqrt(rows * cols) / ||Oh||_F * Oh_ij      (update RMS == target_rms)
/// so that W <- W (1 - lr wd) - lr * O is the paper's step theta <- theta - eta lambda theta -
/// eta_hat Oh with eta_hat = 0.2 eta sqrt(m n) / ||Oh||_F (target_rms = 0.2).
/// O: [rows, cols] row-major f32 ([fan_out, fan_in]; rows are neurons). v: [rows] f32 state
/// (zeros before the first step), updated. Row means and ||Oh||_F accumulate in f64 in a fixed
/// order (bitwise independent of the OpenMP thread count); v, Oh and the result are f32.
/// A zero O gives a zero update (v <- beta2 v). With per-head or split-QKV blocks, call it on each
/// block with that block's slice of v (the RMS target then holds per block).
/// Throws std::invalid_argument for non-positive shapes, null buffers, beta2 outside [0, 1),
/// eps < 0 or a negative / non-finite target_rms.
void normuon_normalize_cpu(float* O, float* v, int64_t rows, int64_t cols, double beta2 = kNorMuonBeta2,
                           double eps = kNorMuonEps, double target_rms = kNorMuonUpdateRms);

}  // namespace mfsdp
