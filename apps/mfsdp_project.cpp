// mfsdp-project: cluster projection of step time and per-rank memory (planner/projection.h).
//   mfsdp-project --cluster configs/clusters/a100_80gb_8x.json --model llama-7b [--placements ...]
//                 [--worlds 8 16 ... 512] [--replicate R] [--ns-steps 5] [--dtype auto] [--json out.json]
//   mfsdp-project --cluster C --paper            the paper's setups next to its figures, largest fits
//   mfsdp-project --cluster C --capacity [--memory-gb G] [--worlds ...]   largest preset per family that fits
//   mpirun -np 2 mfsdp-project --calibrate this_machine.json      measure this machine's constants
//   mfsdp-project --calibrate gpu.json --device cuda [--cluster base.json] [--calibrate-sizes 256 1024 ...]
//                                                one GPU's constants; interconnect fields from base.json
//   mfsdp-project --cluster this_machine.json --compare bench.json [--tolerance 5] [--ratio-tolerance 2]
//                                                predictions vs mfsdp-bench measurements (exit 1 if off)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <tuple>

#include "apps/bench/calibrate.h"
#include "apps/bench/calibrate_cuda.h"
#include "apps/bench/paper_figures.h"
#include "apps/cli_common.h"
#include "comm/comm_factory.h"
#include "models/model_presets.h"
#include "planner/memory_plan.h"
#include "planner/placement_traits.h"
#include "planner/projection.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"
#include "runtime/engine/projection_rules.h"

using namespace mfsdp;
using nlohmann::json;

namespace {

std::string fmt_params(double n) {
  char b[32];
  std::snprintf(b, sizeof b, n >= 1e9 ? "%.1fB" : "%.0fM", n >= 1e9 ? n / 1e9 : n / 1e6);
  return b;
}

json sweep(const ProjectionInput& base, const std::vector<std::string>& placements, const ClusterSpec& c,
           const std::vector<int>& worlds) {
  json out = json::array();
  std::printf("%s, %s, NS %d (%s), compute %s, B=%d T=%d per rank%s, replicas %d on %s\n", base.model.name.c_str(),
              (std::to_string(base.model.num_params() / 1000000) + "M params").c_str(), base.ns_steps,
              dtype_name(base.ns_dtype), dtype_name(base.dtype), base.batch, base.seq,
              base.activation_checkpointing ? ", activation checkpointing" : "", base.replicas, c.name.c_str());
  ProjectionInput owners = base;  // the schedule the engine's rules give a matrixfsdp run on this cluster
  owners.placement = Placement::matrixfsdp;
  const EngineChoices e = engine_choices(owners, c);
  std::printf("schedule: prefetch depth %d, reductions %s, owners %s, owned matrices %s; %s\n", e.prefetch_depth,
              e.overlap_reduce ? "overlapped" : "blocking", e.planner.round_robin ? "round-robin" : "LPT",
              e.batch_orthogonalize ? "batched by shape" : "one at a time",
              base.baseline.describe(base.ns_dtype, base.ns_steps).c_str());
  std::printf("%6s %-11s %10s %10s %10s %10s %10s %8s\n", "world", "placement", "fwd_ms", "bwd_ms", "reduce_ms",
              "opt_ms", "step_ms", "mem_GB");
  for (int w : worlds) {
    std::map<std::string, Projection> row;
    for (const std::string& p : placements) {
      ProjectionInput in = base;
      in.placement = parse_placement(p);
      if (w % in.replicas || (in.replicas > 1 && !placement_traits(in.placement).replicable())) continue;
      const Projection r = project(in, c, w);
      row[p] = r;
      std::printf("%6d %-11s %10.1f %10.1f %10.1f %10.1f %10.1f %7.1f%s\n", w, p.c_str(), r.forward_ms, r.backward_ms,
                  r.reduce_ms, r.optimizer_ms, r.step_ms, r.total_gb, r.oom ? " OOM" : "");
      json j = r.to_json();
      j["placement"] = p;
      j["model"] = base.model.name;
      out.push_back(j);
    }
    if (row.count("fsdp2") && row.count("matrixfsdp"))
      std::printf("%6d ratio fsdp2/matrixfsdp: optimizer %.2fx, step %.2fx\n", w,
                  row["fsdp2"].optimizer_ms / row["matrixfsdp"].optimizer_ms, row["fsdp2"].step_ms / row["matrixfsdp"].step_ms);
  }
  return out;
}

// The largest preset of `family` (by parameters) whose projected memory per rank fits in
// `budget_gb` at `world` ranks under `placement`, with `base`'s batch, sequence, dtypes and
// checkpointing; "none" (0 parameters) when even the smallest does not.
std::pair<std::string, double> largest_fit(const ProjectionInput& base, const ClusterSpec& c, int world,
                                           Placement placement, const std::string& family, double budget_gb) {
  std::pair<std::string, double> best{"none", 0.0};
  for (const std::string& name : model_preset_names()) {
    ProjectionInput in = base;
    in.model = model_preset(name).profile();
    in.placement = placement;
    if (in.model.family != family) continue;
    const double n = static_cast<double>(in.model.num_params());
    if (n > best.second && memory_needed(project(in, c, world).total_gb, c.gpu() ? 0.0 : kCpuProcessBytes / 1e9) <= budget_gb)
      best = {name, n};
  }
  return best;
}

// --capacity: per world size and placement, the largest preset of each family's size ladder that
// fits in `budget_gb` per rank (planner/memory_plan.h, the model the trainer checks at start-up).
json capacity(const ProjectionInput& base, const ClusterSpec& c, const std::vector<int>& worlds, double budget_gb) {
  const std::vector<std::string> families{"gpt2", "llama", "qwen2_moe"};
  std::printf("\nLargest preset that fits in %.1f GB per rank on %s (%s, %scheckpointing, B=%d T=%d)\n", budget_gb,
              c.name.c_str(), dtype_name(base.dtype), base.activation_checkpointing ? "" : "no ", base.batch, base.seq);
  std::printf("%6s %-11s", "world", "placement");
  for (const std::string& f : families) std::printf(" %-24s", f.c_str());
  std::printf("\n");
  json out = json::array();
  for (int w : worlds)
    for (const auto& [placement, p] : kPlacementNames.entries) {
      std::printf("%6d %-11s", w, p);
      for (const std::string& f : families) {
        const auto [name, params] = largest_fit(base, c, w, placement, f, budget_gb);
        std::printf(" %-24s", (name + (params > 0 ? " (" + fmt_params(params) + ")" : "")).c_str());
        out.push_back({{"world", w}, {"placement", p}, {"family", f}, {"model", name}, {"params", params}});
      }
      std::printf("\n");
    }
  return out;
}

// The published figures next to the projection (apps/bench/paper_figures.h); then the largest
// Llama preset that fits per placement.
json paper(const ClusterSpec& c, const BaselineOptions& baseline) {
  json out = paper_figures(c, baseline);
  ProjectionInput l7;
  l7.model = model_preset("llama-7b").profile();
  l7.seq = 4096;
  l7.activation_checkpointing = true;
  std::printf("\nLargest Llama preset that fits in %.0f GB per GPU (bf16, checkpointing, B=1 T=4096)\n", c.memory_gb);
  for (int w : {8, 64})
    for (const auto& [placement, p] : kPlacementNames.entries) {
      const auto [best, best_params] = largest_fit(l7, c, w, placement, "llama", c.memory_gb - c.reserve_gb);
      std::printf("  W=%-3d %-11s %s (%.1fB)\n", w, p, best.c_str(), best_params / 1e9);
      out["largest_fit"].push_back({{"world", w}, {"placement", p}, {"model", best}, {"params", best_params}});
    }
  return out;
}

// Throws std::runtime_error "<where>.<field>: out of range" for a bench row the projection cannot
// take (sizes below 1, replicas not dividing the world, times that are not positive).
void check_bench_row(const ProjectionInput& in, int world, double opt_ms, double step_ms, const std::string& where) {
  const auto need = [&](bool ok, const char* field) {
    if (!ok) throw std::runtime_error(where + "." + field + ": out of range");
  };
  need(world >= 1 && world <= cli::kMaxWorld, "world");
  need(in.batch >= 1 && in.batch <= cli::kMaxBatch, "batch");
  need(in.seq >= 1 && in.seq <= cli::kMaxSeq, "seq");
  need(in.ns_steps >= 1 && in.ns_steps <= cli::kMaxNsSteps, "ns_steps");
  need(in.replicas >= 1 && world % in.replicas == 0, "replicas");
  need(opt_ms > 0 && std::isfinite(opt_ms), "ms.optimizer");
  need(step_ms > 0 && std::isfinite(step_ms), "ms.total");
}

// Field `key` of the object `row` as T; throws "<where>.<key>: missing" or the JSON library's
// reason ("type must be number, but is string") without its prefix.
template <class T>
T bench_field(const json& row, const char* key, const std::string& where) {
  if (!row.is_object()) throw std::runtime_error(where + ": expected an object, got " + std::string(row.type_name()));
  const auto it = row.find(key);
  if (it == row.end()) throw std::runtime_error(where + "." + key + ": missing");
  try {
    return it->get<T>();
  } catch (const json::exception& e) {
    throw std::runtime_error(where + "." + key + ": " + json_error_text(e.what()));
  }
}

// Predictions for each mfsdp-bench result. Returns {largest |log(predicted / measured)| of the
// times, largest |log| of the placement ratios (time / matrixfsdp's time at the same world size and
// NS steps, predicted over measured)}: the ratios cancel the machine's speed, which on shared cores
// varies with the other jobs between calibration and measurement.
std::pair<double, double> compare(const ClusterSpec& c, const std::string& bench_path, json& out) {
  const std::string text = read_input_file(bench_path, "--compare", size_t{64} << 20);  // regular files only
  if (json_nesting_depth(text) > kMaxJsonDepth) throw std::runtime_error(bench_path + ": nested deeper than 64 levels");
  json b;
  try {
    b = json::parse(text);
  } catch (const json::exception& e) {
    throw std::runtime_error(bench_path + ": invalid JSON: " + json_error_text(e.what()));
  }
  if (!b.is_object() || !b.contains("results") || !b["results"].is_array())
    throw std::runtime_error(bench_path + ": results: expected a list of mfsdp-bench results (mfsdp-bench --json)");
  double worst = 0, worst_ratio = 0;
  std::map<std::string, std::pair<double, double>> base_meas, base_pred;  // (world, ns) -> matrixfsdp (opt, step)
  std::vector<std::tuple<std::string, std::string, double, double, double, double>> rows;
  std::printf("%-10s %5s %3s %-11s %10s %10s %7s %10s %10s %7s\n", "model", "world", "ns", "placement", "opt_meas",
              "opt_pred", "factor", "step_meas", "step_pred", "factor");
  size_t row = 0;
  for (const json& r : b.at("results")) {
    const std::string where = bench_path + ": results[" + std::to_string(row++) + "]";
    if (r.is_object() && r.value("expert_parallel", false)) continue;  // the projection gathers experts
    ProjectionInput in;
    ModelShape shape = model_preset(bench_field<std::string>(r, "model", where), bench_field<int>(r, "layers", where));
    if (r.is_object() && r.contains("vocab")) {  // mfsdp-bench --vocab; older files have the preset's
      shape.vocab = bench_field<int64_t>(r, "vocab", where);
      if (shape.vocab < 1 || shape.vocab > (int64_t{1} << 24)) throw std::runtime_error(where + ".vocab: out of range");
    }
    in.model = shape.profile();
    in.placement = parse_placement(bench_field<std::string>(r, "placement", where));
    in.ns_steps = bench_field<int>(r, "ns_steps", where);
    const std::string dtype = bench_field<std::string>(r, "dtype", where);
    const std::optional<DType> measured = kAutoDTypeNames.find(dtype).value_or(std::nullopt);
    if (!measured) throw std::runtime_error(where + ".dtype: expected bf16 or f32, got '" + dtype + "'");
    in.dtype = in.ns_dtype = *measured;
    in.batch = bench_field<int>(r, "batch", where);
    in.seq = bench_field<int>(r, "seq", where);
    in.replicas = r.is_object() && r.contains("replicas") ? bench_field<int>(r, "replicas", where) : 1;
    const int W = bench_field<int>(r, "world", where);
    const json ms = bench_field<json>(r, "ms", where);
    const double om = bench_field<double>(ms, "optimizer", where + ".ms"), sm = bench_field<double>(ms, "total", where + ".ms");
    check_bench_row(in, W, om, sm, where);
    const Projection p = project(in, c, W);
    const double ro = p.optimizer_ms / om, rs = p.step_ms / sm;
    worst = std::max({worst, std::fabs(std::log(ro)), std::fabs(std::log(rs))});
    std::printf("%-10s %5d %3d %-11s %10.1f %10.1f %7.2f %10.1f %10.1f %7.2f\n", in.model.name.c_str(), W, in.ns_steps,
                placement_name(in.placement), om, p.optimizer_ms, ro, sm, p.step_ms, rs);
    const std::string key = in.model.name + " W=" + std::to_string(W) + " ns=" + std::to_string(in.ns_steps);
    if (in.placement == Placement::matrixfsdp) base_meas[key] = {om, sm}, base_pred[key] = {p.optimizer_ms, p.step_ms};
    rows.emplace_back(key, placement_name(in.placement), om, sm, p.optimizer_ms, p.step_ms);
    out["cases"].push_back({{"model", in.model.name}, {"world", W}, {"placement", placement_name(in.placement)},
                            {"ns_steps", in.ns_steps}, {"optimizer_measured_ms", om}, {"optimizer_predicted_ms", p.optimizer_ms},
                            {"step_measured_ms", sm}, {"step_predicted_ms", p.step_ms}});
  }
  std::printf("placement / matrixfsdp, measured vs predicted:\n");
  for (const auto& [key, pl, om, sm, op, sp] : rows) {
    if (pl == std::string("matrixfsdp") || !base_meas.count(key)) continue;
    const double mo = om / base_meas[key].first, ms = sm / base_meas[key].second;
    const double po = op / base_pred[key].first, ps = sp / base_pred[key].second;
    worst_ratio = std::max({worst_ratio, std::fabs(std::log(po / mo)), std::fabs(std::log(ps / ms))});
    std::printf("  %-26s %-6s optimizer %6.2fx measured, %6.2fx predicted; step %6.2fx measured, %6.2fx predicted\n",
                key.c_str(), pl.c_str(), mo, po, ms, ps);
    out["ratios"].push_back({{"case", key}, {"placement", pl}, {"optimizer_measured", mo}, {"optimizer_predicted", po},
                             {"step_measured", ms}, {"step_predicted", ps}});
  }
  return {worst, worst_ratio};
}

/// The command line: the mode (--calibrate, --compare, projection with optional --paper), the
/// projection's input and the sweep (placements x world sizes).
struct ProjectArgs {
  std::string cluster_path, calibrate_path, compare_path, json_path, model = "llama-7b";
  std::optional<BaselineNs> fsdp2_ns;       ///< unset: every_rank, or row_sharded with --paper
  std::optional<DType> dtype, ns_dtype;     ///< unset: auto, resolved per cluster (resolve_projection_dtype)
  Device device = Device::CPU;              ///< --calibrate's device: cpu (under mpirun) or cuda (one GPU)
  std::vector<int> calibrate_sizes;  ///< --calibrate --device cuda: GEMM sides (empty: CudaCalibration's)
  std::vector<std::string> placements = kPlacementNames.names();
  std::vector<int> worlds{8, 16, 32, 64, 128, 256, 512};
  ProjectionInput in;
  int layers = 0;
  bool paper_mode = false;
  bool capacity_mode = false;
  std::optional<double> memory_gb;  ///< --capacity's budget per rank; unset: the cluster's memory_gb - reserve_gb
  double tolerance = 5.0, ratio_tolerance = 2.0;
};

/// Declares the options of the projection input itself (model shape, dtypes, fsdp2 baseline,
/// schedule) on `app`, bound to `a.in`, `a.dtype`, `a.ns_dtype` and `a.fsdp2_ns`.
void add_projection_input_options(CLI::App& app, ProjectArgs& a) {
  ProjectionInput& in = a.in;
  app.add_option("--replicate", in.replicas, "HSDP replicas R")
      ->capture_default_str()
      ->check(CLI::Range(1, cli::kMaxReplicas));
  app.add_option("--ns-steps", in.ns_steps, "Newton-Schulz iterations")
      ->capture_default_str()
      ->check(CLI::Range(1, cli::kMaxNsSteps));
  cli::add_choice(app, "--dtype", a.dtype, kAutoDTypeNames,
                  "compute/communication dtype: bf16 | f32 | auto (bf16 on GPU clusters; on a calibrated CPU "
                  "cluster the faster of its measured GEMM rates)");
  cli::add_choice(app, "--ns-dtype", a.ns_dtype, kAutoDTypeNames, "Newton-Schulz dtype: bf16 | f32 | auto (as --dtype)");
  app.add_option("-B,--batch", in.batch, "sequences per rank")->capture_default_str()->check(CLI::Range(1, cli::kMaxBatch));
  app.add_option("-T,--seq", in.seq, "tokens per sequence")->capture_default_str()->check(CLI::Range(1, cli::kMaxSeq));
  app.add_flag("--checkpointing", in.activation_checkpointing, "activation checkpointing");
  app.add_option_function<std::string>(
         "--fsdp2-ns", [&a](const std::string& s) { a.fsdp2_ns = parse_baseline_ns(s); },
         "fsdp2 baseline's Newton-Schulz: every_rank (gather each matrix, every rank runs all; default) | "
         "row_sharded (torch.optim.Muon on FSDP2 DTensors; --paper's default)")
      ->check(CLI::IsMember({baseline_ns_name(BaselineNs::every_rank), baseline_ns_name(BaselineNs::row_sharded)}));
  app.add_option_function<std::string>(
         "--fsdp2-gather-dtype", [&in](const std::string& s) { in.baseline.gather_dtype = kAutoDTypeNames.find(s).value(); },
         "fsdp2 baseline's Muon-input gather dtype (default: --ns-dtype)")
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option_function<int>(
         "--fsdp2-ns-steps", [&in](int steps) { in.baseline.ns_steps = steps; },
         "fsdp2 baseline's Newton-Schulz steps (default: --ns-steps)")
      ->check(CLI::Range(0, cli::kMaxNsSteps));
  app.add_option("--fsdp2-host-op-us", in.baseline.host_op_us,
                 "row_sharded baseline: host dispatch per DTensor op, microseconds")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e5));
  app.add_option("--prefetch-depth", in.prefetch_depth, "units gathered ahead (default: the engine's for the device)")
      ->check(CLI::Range(0, 64));
  cli::add_choice(app, "--overlap-reduce", in.overlap_reduce, kToggleNames,
                  "on: reductions overlap the next unit's backward, off: they block, auto: the engine's device default");
  cli::add_choice(app, "--batch-orthogonalize", in.batch_orthogonalize, kToggleNames,
                  "on: an owner's same-shape matrices in one batched chain, off: one at a time, auto: the engine's "
                  "device default");
  app.add_flag("--round-robin-owners", in.round_robin_owners, "owners k % N instead of LPT");
}

/// Declares every option of mfsdp-project on `app`, bound to the fields of `a`.
void add_project_options(CLI::App& app, ProjectArgs& a) {
  app.add_option("--cluster", a.cluster_path, "cluster JSON (configs/clusters/)");
  app.add_option("--calibrate", a.calibrate_path, "measure this machine (under mpirun) and write its cluster JSON");
  cli::add_choice(app, "--device", a.device, kDeviceNames,
                  "--calibrate's device: cpu (this machine's ranks, under mpirun) | cuda (this process's GPU; "
                  "--cluster gives the fields one GPU cannot measure)");
  app.add_option("--calibrate-sizes", a.calibrate_sizes, "--calibrate --device cuda: square GEMM and Newton-Schulz "
                                                         "sides, increasing (default 256 512 768 1024 2048 4096 8192)")
      ->check(CLI::Range(16, 16384));
  app.add_option("--compare", a.compare_path, "mfsdp-bench --json output to predict and compare with");
  app.add_option("--tolerance", a.tolerance, "--compare fails when a predicted time is off by more than this factor")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--ratio-tolerance", a.ratio_tolerance,
                 "--compare fails when a predicted placement / matrixfsdp ratio is off by more than this factor")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--model", a.model, "model preset (models/model_presets.h)")->capture_default_str();
  app.add_option("--layers", a.layers, "override the preset's layer count (0 = keep)")->check(CLI::Range(0, cli::kMaxLayers));
  app.add_option("--placements", a.placements, "placements")
      ->capture_default_str()
      ->check(CLI::IsMember(kPlacementNames.names()));
  app.add_option("--worlds", a.worlds, "world sizes")->capture_default_str()->check(CLI::Range(1, cli::kMaxWorld));
  add_projection_input_options(app, a);
  app.add_flag("--paper", a.paper_mode, "the paper's setups and the largest Llama that fits");
  app.add_flag("--capacity", a.capacity_mode,
               "the largest preset of each family that fits per rank, per world size and placement (with -B, -T, "
               "--dtype, --checkpointing)");
  app.add_option("--memory-gb", a.memory_gb, "--capacity's memory per rank, GB (default: the cluster's memory_gb "
                                             "less reserve_gb)")
      ->check(CLI::Range(0.001, 1e6));
  app.add_option("--json", a.json_path, "write the projection as JSON");
}

/// --calibrate: measures this machine over the host communicator (under mpirun); rank 0 prints
/// the cluster JSON and writes it to `path` (write-then-swap). Returns the exit code (2 when the
/// file cannot be written).
int run_calibrate(int* argc, char*** argv, const std::string& path) {
  MpiSession mpi(argc, argv);
  auto comm = make_host_communicator();
  const ClusterSpec c = calibrate_this_machine(*comm);
  if (comm->rank() != 0) return 0;
  std::printf("%s\n", c.to_json().dump(2).c_str());
  try {
    write_file_swap(path, c.to_json().dump(2) + "\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-project: --calibrate: %s\n", e.what());
    return 2;
  }
  return 0;
}

/// --calibrate --device cuda: measures this process's GPU (no MPI job) and writes its cluster JSON
/// with the raw timings under "measurements"; the fields one GPU cannot measure come from
/// --cluster when given. Throws (exit 2 in main) without CUDA, without a visible GPU, or when the
/// file cannot be written.
int run_calibrate_cuda(const ProjectArgs& a) {
  CudaCalibration what;
  if (!a.calibrate_sizes.empty()) what.sizes = a.calibrate_sizes;
  const ClusterSpec base = a.cluster_path.empty() ? ClusterSpec{} : ClusterSpec::load(a.cluster_path);
  const CudaCalibrationResult r = calibrate_cuda_device(what, base, a.cluster_path);
  json j = r.cluster.to_json();
  j["measurements"] = r.measurements;
  std::printf("%s\n", j.dump(2).c_str());
  const auto& sizes = r.measurements["sizes"], &eff = r.measurements["ns_efficiency"];
  for (size_t i = 0; i < sizes.size() && i < eff.size(); ++i)
    std::printf("Newton-Schulz (bf16, %d steps) at %dx%d: %.0f%% of the cuBLAS bf16 GEMM rate measured at that size\n",
                what.ns_steps, sizes[i].get<int>(), sizes[i].get<int>(), 100.0 * eff[i].get<double>());
  write_file_swap(a.calibrate_path, j.dump(2) + "\n");
  return 0;
}

/// --compare: predictions for each row of the bench JSON on cluster `c`, added to `out`. Returns
/// 0 within both tolerances, 1 outside, 2 when --json cannot be written; throws on a bad bench file.
int run_compare(const ClusterSpec& c, const ProjectArgs& a, json& out) {
  const auto [worst, worst_ratio] = compare(c, a.compare_path, out["compare"]);
  std::printf("largest error factor: times %.2f (tolerance %.2f), placement ratios %.2f (tolerance %.2f)\n",
              std::exp(worst), a.tolerance, std::exp(worst_ratio), a.ratio_tolerance);
  out["worst_factor"] = std::exp(worst);
  out["worst_ratio_factor"] = std::exp(worst_ratio);
  if (!a.json_path.empty() && cli::write_json_output("mfsdp-project", a.json_path, out.dump(2) + "\n") != 0) return 2;
  return std::exp(worst) <= a.tolerance && std::exp(worst_ratio) <= a.ratio_tolerance ? 0 : 1;
}

/// Refuses a sweep that would print rows for none of its cases, or skip some silently: HSDP's
/// `replicas` must divide every world size, and a replicable placement must remain (ddp has no
/// shard group to replicate: PlacementTraits::replicable). Throws std::runtime_error naming the options.
void check_sweep(int replicas, const std::vector<std::string>& placements, const std::vector<int>& worlds) {
  std::string bad;
  for (int w : worlds)
    if (w % replicas != 0) bad += (bad.empty() ? "" : ", ") + std::to_string(w);
  const std::string r = "--replicate " + std::to_string(replicas);
  if (!bad.empty())
    throw std::runtime_error(r + " does not divide the world size " + bad + " (HSDP runs R replicas of world / R ranks);" +
                             " choose --worlds that R divides, or another --replicate");
  if (replicas > 1 && std::none_of(placements.begin(), placements.end(), [](const std::string& p) {
        return placement_traits(parse_placement(p)).replicable();
      }))
    throw std::runtime_error(r + ": ddp has no shard group to replicate; add another placement to --placements");
}

/// The projection sweep on cluster `c` (and with --paper the published setups), added to `out`.
/// Returns the exit code (2 when --json cannot be written); throws on a bad preset.
int run_projection(const ClusterSpec& c, ProjectArgs& a, json& out) {
  ProjectionInput& in = a.in;
  in.model = model_preset(a.model, a.layers).profile();
  in.dtype = resolve_projection_dtype(a.dtype, c);  // the rate of the dtype that will run
  in.ns_dtype = resolve_projection_dtype(a.ns_dtype, c);
  if (a.fsdp2_ns) in.baseline.ns = *a.fsdp2_ns;
  if (a.capacity_mode) {
    out["capacity"] = capacity(in, c, a.worlds, a.memory_gb.value_or(c.memory_gb - c.reserve_gb));
    return a.json_path.empty() ? 0 : cli::write_json_output("mfsdp-project", a.json_path, out.dump(2) + "\n");
  }
  check_sweep(in.replicas, a.placements, a.worlds);
  out["projection"] = sweep(in, a.placements, c, a.worlds);
  if (a.paper_mode) {
    BaselineOptions published = in.baseline;
    if (!a.fsdp2_ns) published.ns = BaselineNs::row_sharded;  // torch.optim.Muon on FSDP2 DTensors
    out["paper"] = paper(c, published);
  }
  return a.json_path.empty() ? 0 : cli::write_json_output("mfsdp-project", a.json_path, out.dump(2) + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mfsdp-project: step time and memory per rank of a placement on a cluster, world 8..512"};
  ProjectArgs args;
  add_project_options(app, args);
  if (const int rc = cli::parse_or_exit_code(app, argc, argv); rc >= 0) return rc;
  for (const std::string& e : {cli::json_output_problem("mfsdp-project", args.json_path),
                                cli::json_output_problem("mfsdp-project", args.calibrate_path)})
    if (!e.empty()) {
      std::fprintf(stderr, "%s\n", e.c_str());
      return 2;
    }
  try {
    if (args.device != Device::CPU && args.calibrate_path.empty()) throw std::runtime_error("--device applies to --calibrate only");
    if (!args.calibrate_path.empty() && args.device == Device::CUDA) return run_calibrate_cuda(args);
    if (!args.calibrate_path.empty()) return run_calibrate(&argc, &argv, args.calibrate_path);
    if (args.cluster_path.empty()) throw std::runtime_error("--cluster is required (or --calibrate)");
    const ClusterSpec c = ClusterSpec::load(args.cluster_path);
    json out{{"cluster", c.to_json()}};
    if (!args.compare_path.empty()) return run_compare(c, args, out);
    return run_projection(c, args, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-project: %s\n", e.what());
    return 2;
  }
}
