// NorMuon: neuron-wise (per-row) second-moment normalization of an orthogonalized Muon update.
// Li, Liu, Liang, Chen and Zhao, "NorMuon: Making Muon more efficient and scalable",
// arXiv 2510.05491 (Algorithm 1).
#pragma once
#include <cstdint>
#include <string>

namespace mfsdp {

/// Which update rule the Muon group runs after orthogonalization (config key `variant`).
/// muon: W <- W (1 - lr wd) - lr * scale * O (scale from MuonScaleRule).
/// normuon: O is replaced by the NorMuon update of normuon_normalize_cpu (RMS kNorMuonUpdateRms),
///   then W <- W (1 - lr wd) - lr * update (scale 1; the scale rule does not apply).
enum class MuonVariant { muon, normuon };

/// Parses "muon" / "normuon"; throws std::invalid_argument naming the bad value and the allowed ones.
MuonVariant parse_muon_variant(const std::string& s);
/// The config name of `v` ("muon" or "normuon").
const char* muon_variant_name(MuonVariant v);

/// RMS of the NorMuon update: Algorithm 1's learning rate eta_hat = 0.2 * eta * sqrt(m n) / ||O_hat||_F
/// applied to O_hat is eta times an update of RMS exactly 0.2 (Adam-like update RMS).
inline constexpr double kNorMuonUpdateRms = 0.2;
/// Default beta2 (second-moment EMA) and epsilon of NorMuon.
inline constexpr double kNorMuonBeta2 = 0.95;
inline constexpr double kNorMuonEps = 1e-8;

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
