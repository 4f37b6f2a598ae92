// The published figures of owner-placed Muon next to the cluster projection (mfsdp-project
// --paper): each figure, its source, the projection and the relative error, with the model term
// that fails where a figure is not matched within the tolerance.
#pragma once
#include <nlohmann/json.hpp>

#include "planner/projection.h"

namespace mfsdp {

/// Relative error under which a projected figure counts as matched (|pred / published - 1|).
inline constexpr double kPaperTolerance = 0.25;

/// Prints the table of published figures and projections on `c` (the published runs are on
/// A100-SXM4-80GB: pass configs/clusters/a100_80gb_8x.json) with the fsdp2 baseline of
/// `baseline` (the published baseline is torch.optim.Muon on FSDP2 DTensors: row_sharded, NS 2),
/// and returns it as JSON: {"figures": [{what, source, published, projected, rel_error, matched,
/// failing_term}], "baseline": line}.
nlohmann::json paper_figures(const ClusterSpec& c, const BaselineOptions& baseline);

}  // namespace mfsdp
