// One mfsdp-bench case: a model, a placement, Newton-Schulz steps and a batch, trained for a few
// steps after warm-up on random tokens; per-phase medians, bytes per phase and peak memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "models/model_presets.h"
#include "planner/shard_plan.h"

namespace mfsdp {

/// What to measure. `replicas` > 1 runs HSDP: `comm` is then the shard group and `replica` the
/// replica group (comm/comm_factory.h make_hsdp_groups).
struct BenchCase {
  ModelShape model;           ///< any family of models/model_presets.h (GPT, Llama, MoE)
  Placement placement = Placement::matrixfsdp;
  int ns_steps = 5;           ///< Newton-Schulz iterations of Muon
  int batch = 1, seq = 64;    ///< sequences of `seq` tokens per rank per step
  int warmup = 1, steps = 2;  ///< unmeasured, then measured steps
  int replicas = 1;
  DType dtype = DType::f32;  ///< compute and communication dtype (the CPU engine is f32 only)
  std::vector<int> node_of_rank;  ///< shard-group rank -> node (PlannerOptions); empty: one node
  Toggle batch_orthogonalize = Toggle::automatic;  ///< EngineOptions::batch_orthogonalize
  bool expert_parallel = false;  ///< matrixfsdp with experts staying with their owners (MoE shapes)
};

/// Phase names of BenchResult::ms, in order: forward, backward, reduce, optimizer, total.
const std::vector<std::string>& bench_time_phases();
/// Memory categories of BenchResult::mib, in order: params, grads, opt_state, persistent
/// (= the first three), gathered_params, gathered_grads, activations, comm_buffers, planned (the
/// start-up memory plan's total, planner/memory_plan.h), total (the measured peak of the sum).
const std::vector<std::string>& bench_memory_categories();

/// Measurements of one case, the same on every rank.
struct BenchResult {
  BenchCase c;
  int world = 1;                       ///< all ranks (shard group x replicas)
  std::vector<double> ms;              ///< per bench_time_phases(): median over measured steps of the max over ranks, ms
  std::vector<double> bytes;           ///< per CommPhase (fwd_gather..other): max over ranks of sent + received per step
  std::vector<double> mib;             ///< per bench_memory_categories(): max over ranks of the peak, MiB
  double tokens_per_second = 0;        ///< global tokens / median total
  double loss = 0;                     ///< last measured step's loss (a sanity value)
  nlohmann::json to_json() const;
};

/// Runs `c` on `comm` (and `replica` for HSDP; may be null when c.replicas == 1): builds the
/// model of c.model's family, plans for comm.world_size(), trains c.warmup + c.steps steps.
/// Collective over every rank. Throws std::invalid_argument for a dtype other than f32, a bad
/// shape or bad sizes.
BenchResult run_bench_case(Communicator& comm, Communicator* replica, const BenchCase& c);

/// The median of `v` (mean of the middle two for even sizes); 0 for an empty vector.
double median(std::vector<double> v);

}  // namespace mfsdp
