#include "optim/muon_options.h"

#include <stdexcept>
#include <string>

namespace mfsdp {

MuonScaleRule parse_muon_scale_rule(const std::string& s) {
  if (s == "original") return MuonScaleRule::original;
  if (s == "match_rms_adamw") return MuonScaleRule::match_rms_adamw;
  throw std::invalid_argument("[parse_muon_scale_rule] unknown scale rule '" + s +
                              "' (expected original or match_rms_adamw)");
}

const char* muon_scale_rule_name(MuonScaleRule r) {
  return r == MuonScaleRule::original ? "original" : "match_rms_adamw";
}

Orthogonalizer parse_orthogonalizer(const std::string& s) {
  if (s == "newton_schulz5") return Orthogonalizer::newton_schulz5;
  if (s == "polar_express") return Orthogonalizer::polar_express;
  if (s == "gram_newton_schulz") return Orthogonalizer::gram_newton_schulz;
  throw std::invalid_argument("[parse_orthogonalizer] unknown orthogonalizer '" + s +
                              "' (expected newton_schulz5, polar_express or gram_newton_schulz)");
}

const char* orthogonalizer_name(Orthogonalizer o) {
  switch (o) {
    case Orthogonalizer::newton_schulz5: return "newton_schulz5";
    case Orthogonalizer::polar_express: return "polar_express";
    case Orthogonalizer::gram_newton_schulz: return "gram_newton_schulz";
  }
  return "?";
}

namespace {
/// The config names of NsDType, indexed by the enumerator: parsing and naming share them.
constexpr const char* kNsDTypeNames[] = {"f32", "bf16"};
}  // namespace

NsDType parse_ns_dtype(const std::string& s) {
  for (int i = 0; i < 2; ++i)
    if (s == kNsDTypeNames[i]) return static_cast<NsDType>(i);
  throw std::invalid_argument("[parse_ns_dtype] unknown ns_dtype '" + s + "' (expected f32 or bf16)");
}

const char* ns_dtype_name(NsDType d) { return kNsDTypeNames[static_cast<int>(d)]; }

MuonVariant parse_muon_variant(const std::string& s) {
  if (s == "muon") return MuonVariant::muon;
  if (s == "normuon") return MuonVariant::normuon;
  throw std::invalid_argument("[parse_muon_variant] unknown Muon variant '" + s + "' (expected muon or normuon)");
}

const char* muon_variant_name(MuonVariant v) { return v == MuonVariant::muon ? "muon" : "normuon"; }

}  // namespace mfsdp
