// The Muon group's options and their enumerations, with the names configs use. Kept apart from
// the kernels so that config parsers and the planner need no linear algebra.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/core/name_table.h"

namespace mfsdp {

/// How the orthogonalized update of an m x n matrix ([fan_out, fan_in]) is scaled.
/// original:        sqrt(max(1, m/n))        (Keller Jordan's Muon)
/// match_rms_adamw: 0.2 * sqrt(max(m, n))    (update RMS comparable to AdamW's, Moonshot's rule)
enum class MuonScaleRule { original, match_rms_adamw };
/// "original", "match_rms_adamw".
inline constexpr NameTable<MuonScaleRule, 2> kMuonScaleRuleNames{
    {{{MuonScaleRule::original, "original"}, {MuonScaleRule::match_rms_adamw, "match_rms_adamw"}}}};

/// Parses "original" / "match_rms_adamw"; throws std::invalid_argument naming the bad value.
MuonScaleRule parse_muon_scale_rule(const std::string& s);
/// The config name of `r` ("original" or "match_rms_adamw").
const char* muon_scale_rule_name(MuonScaleRule r);

/// The polar-factor approximation Muon runs (optim/orthogonalize.h documents each method).
enum class Orthogonalizer { newton_schulz5, polar_express, gram_newton_schulz };
/// "newton_schulz5", "polar_express", "gram_newton_schulz".
inline constexpr NameTable<Orthogonalizer, 3> kOrthogonalizerNames{{{{Orthogonalizer::newton_schulz5, "newton_schulz5"},
                                                                     {Orthogonalizer::polar_express, "polar_express"},
                                                                     {Orthogonalizer::gram_newton_schulz, "gram_newton_schulz"}}}};
/// Whether gram_newton_schulz restarts (X <- Q X, R <- X X^T, Q <- I) before 0-based step t:
/// t >= 2 and (t - 2) % 3 == 0.
constexpr bool gram_newton_schulz_restarts_before(int t) { return t >= 2 && (t - 2) % 3 == 0; }

/// Parses "newton_schulz5" / "polar_express" / "gram_newton_schulz".
/// Throws std::invalid_argument naming the bad value and the allowed ones.
Orthogonalizer parse_orthogonalizer(const std::string& s);
/// The config name of `o` ("newton_schulz5", "polar_express" or "gram_newton_schulz").
const char* orthogonalizer_name(Orthogonalizer o);

/// Precision of the CPU orthogonalizer's matrix products (config key `ns_dtype`).
/// f32: f32 GEMMs throughout (the default on CPU).
/// bf16: newton_schulz5 / polar_express products take bf16-rounded operands with f32 accumulation
///   (the CPU's bf16 GEMM); normalization and the additions stay f32. gram_newton_schulz is f32 only.
enum class NsDType { f32, bf16 };
/// "f32", "bf16".
inline constexpr NameTable<NsDType, 2> kNsDTypeNames{{{{NsDType::f32, "f32"}, {NsDType::bf16, "bf16"}}}};

/// Parses "f32" / "bf16"; throws std::invalid_argument naming the bad value and the allowed ones.
NsDType parse_ns_dtype(const std::string& s);
/// The config name of `d` ("f32" or "bf16").
const char* ns_dtype_name(NsDType d);

/// Which update rule the Muon group runs after orthogonalization (config key `variant`).
/// muon: W <- W (1 - lr wd) - lr * scale * O (scale from MuonScaleRule).
/// normuon: O is replaced by the NorMuon update of normuon_normalize_cpu (RMS kNorMuonUpdateRms),
///   then W <- W (1 - lr wd) - lr * update (scale 1; the scale rule does not apply).
enum class MuonVariant { muon, normuon };
/// "muon", "normuon".
inline constexpr NameTable<MuonVariant, 2> kMuonVariantNames{{{{MuonVariant::muon, "muon"}, {MuonVariant::normuon, "normuon"}}}};

/// Parses "muon" / "normuon"; throws std::invalid_argument naming the bad value and the allowed ones.
MuonVariant parse_muon_variant(const std::string& s);
/// The config name of `v` ("muon" or "normuon").
const char* muon_variant_name(MuonVariant v);

/// Default beta2 (second-moment EMA) and epsilon of NorMuon.
inline constexpr double kNorMuonBeta2 = 0.95;
inline constexpr double kNorMuonEps = 1e-8;

/// Hyperparameters of the Muon group. `lr` is the group's base learning rate; the engine scales
/// it by the schedule and passes the step's lr to the update functions, which ignore this field.
struct MuonOptions {
  double lr = 0.02;            ///< base learning rate (>= 0)
  double momentum = 0.95;      ///< beta of the momentum buffer, in [0, 1)
  bool nesterov = true;        ///< U = (1-beta)*G + beta*M instead of U = M
  int ns_steps = 5;            ///< Newton-Schulz iterations (>= 0)
  double weight_decay = 0.0;   ///< decoupled: W <- W * (1 - lr*wd)
  MuonScaleRule scale_rule = MuonScaleRule::original;
  bool split_qkv = false;      ///< orthogonalize a fused QKV matrix as qkv_blocks row blocks
  /// Polar-factor approximation (optim/orthogonalize.h); newton_schulz5 is Muon's.
  Orthogonalizer orthogonalizer = Orthogonalizer::newton_schulz5;
  /// muon, or normuon (per-row second-moment normalization after orthogonalization, optim/normuon.h;
  /// needs a per-row state vector, so muon_step_* reject it: the phase API applies it).
  MuonVariant variant = MuonVariant::muon;
  double beta2 = kNorMuonBeta2;      ///< NorMuon second-moment EMA, in [0, 1)
  double normuon_eps = kNorMuonEps;  ///< NorMuon: O / (sqrt(v) + eps), >= 0
  /// Orthogonalize a split matrix (qkv_blocks > 1, e.g. c_attn [3C, C]) per attention head: row
  /// blocks of head_dim rows (head_dim must divide rows / qkv_blocks). Overrides split_qkv.
  bool split_heads = false;
  int64_t head_dim = 0;  ///< rows per head (C / n_head) when split_heads
  /// Precision of the CPU orthogonalizer's products (CUDA runs its iterations in bf16 regardless).
  NsDType ns_dtype = NsDType::f32;
};

}  // namespace mfsdp
