#include "optim/muon_options.h"

#include <string>

namespace mfsdp {

MuonScaleRule parse_muon_scale_rule(const std::string& s) { return kMuonScaleRuleNames.parse(s, "scale rule"); }
const char* muon_scale_rule_name(MuonScaleRule r) { return kMuonScaleRuleNames.name(r); }

Orthogonalizer parse_orthogonalizer(const std::string& s) { return kOrthogonalizerNames.parse(s, "orthogonalizer"); }
const char* orthogonalizer_name(Orthogonalizer o) { return kOrthogonalizerNames.name(o); }

NsDType parse_ns_dtype(const std::string& s) { return kNsDTypeNames.parse(s, "ns_dtype"); }
const char* ns_dtype_name(NsDType d) { return kNsDTypeNames.name(d); }

MuonVariant parse_muon_variant(const std::string& s) { return kMuonVariantNames.parse(s, "Muon variant"); }
const char* muon_variant_name(MuonVariant v) { return kMuonVariantNames.name(v); }

}  // namespace mfsdp
