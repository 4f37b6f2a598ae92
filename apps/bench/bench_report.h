// Text tables and headline ratios of mfsdp-bench results.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_runner.h"

namespace mfsdp {

/// One row per result: model, NS steps, dtype, placement, the phase medians (ms), MB moved per
/// step in the gather, reduce and optimizer phases, persistent and total peak MiB per rank.
std::string bench_time_table(const std::vector<BenchResult>& results);
/// One row per result: peak MiB per rank (max over ranks) of every bench_memory_categories() entry.
std::string bench_memory_table(const std::vector<BenchResult>& results);
/// For every (model, ns_steps, dtype, world) measured under both fsdp2 and matrixfsdp:
/// {"model", "ns_steps", "dtype", "world", "optimizer_ratio", "step_ratio"} with ratio =
/// fsdp2 ms / matrixfsdp ms (> 1: matrixfsdp is faster).
nlohmann::json bench_ratios(const std::vector<BenchResult>& results);

}  // namespace mfsdp
