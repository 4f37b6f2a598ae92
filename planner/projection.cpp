#include "planner/projection.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>

#include "planner/cost_model.h"
#include "planner/placement_traits.h"
#include "planner/memory_plan.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/gemm_rates.h"
#include "runtime/core/json_fields.h"
#include "runtime/core/json_limits.h"
#include "planner/planner.h"
#include "planner/projection_terms.h"

namespace mfsdp {
namespace {

// Bytes per element of a projected dtype (bf16 or f32; std::invalid_argument otherwise).
double dtype_bytes(DType d) {
  if (d != DType::f32 && d != DType::bf16)
    throw std::invalid_argument(std::string("projection: dtype must be bf16 or f32, got '") + dtype_name(d) + "'");
  return static_cast<double>(dtype_size(d));
}

// Elementwise optimizer traffic per element (f32 reads + writes): AdamW p, g, m, v in and p, m, v
// out = 7 x 4 B; Muon momentum and apply: g, m in, m out, then p, update in, p out = 6 x 4 B.
constexpr double kAdamWBytesPerElement = 28, kMuonElementwiseBytes = 24;

struct Cost {
  const ClusterSpec& c;
  int world;
  double share() const {  // a CPU rank's part of its node's cores
    if (c.cores_per_node <= 0) return 1.0;
    return std::min(1.0, static_cast<double>(c.cores_per_node) / std::min(world, c.gpus_per_node));
  }
  // One collective over n ranks moving `bytes` per rank; `in_node`: every member on one node.
  double coll(double bytes, int n, bool in_node) const {
    if (n <= 1) return 0;
    const double bw = (in_node ? c.intra_GBps : c.inter_GBps) * 1e9;
    const double lat = (in_node ? c.intra_latency_us : c.inter_latency_us) * 1e-6;
    const double hops = c.linear_latency ? n - 1 : std::ceil(std::log2(static_cast<double>(n)));
    return bytes / bw + hops * lat;
  }
};

using Shape = std::pair<int64_t, int64_t>;

struct RankWork {
  double muon_elems = 0, adamw_elems = 0;
  std::map<Shape, int> matrices;  ///< Muon matrices this rank orthogonalizes, by shape
};

// Per rank: optimizer work under the plan (see project()).
std::vector<RankWork> rank_work(const ShardPlan& plan) {
  const int N = plan.world_size;
  const PlacementTraits traits = placement_traits(plan.placement);
  const bool everyone = traits.every_rank_orthogonalizes();
  std::vector<RankWork> w(static_cast<size_t>(N));
  std::map<Shape, int> all;
  for (const MatrixShard& s : plan.shards) {
    const bool muon = s.optimizer == OptimizerKind::muon;
    if (muon) ++all[{s.shape[0], s.shape[1]}];
    if (traits.every_rank_updates_all) {
      for (RankWork& x : w) (muon ? x.muon_elems : x.adamw_elems) += static_cast<double>(s.numel());
      continue;
    }
    for (const ShardPiece& p : s.pieces) {
      RankWork& x = w[static_cast<size_t>(p.rank)];
      (muon ? x.muon_elems : x.adamw_elems) += static_cast<double>(p.numel);
      if (muon && !everyone) ++x.matrices[{s.shape[0], s.shape[1]}];
    }
  }
  if (everyone)
    for (RankWork& x : w) x.matrices = all;
  return w;
}

// The memory of the rank that needs most (planner/memory_plan.h, the trainer's start-up model)
// into p; returns its total in GB.
double memory_gb(const ProjectionInput& in, const ShardPlan& plan, const EngineChoices& engine, Projection& p) {
  const MemoryModel model{in.model.n_layer, in.model.n_embd, in.model.n_head, in.model.vocab};
  MemoryPlanOptions o;
  o.micro_batch = in.batch;
  o.seq = in.seq;
  o.param_dtype = o.compute_dtype = in.dtype;
  o.recompute = in.activation_checkpointing;
  o.prefetch_depth = engine.prefetch_depth;
  o.overlap_reduce = engine.overlap_reduce;
  o.batch_orthogonalize = engine.batch_orthogonalize;
  const MemoryPlan m = plan_memory_worst(plan, model, o);
  p.persistent_gb = m.persistent() / 1e9;
  p.gathered_gb = (m.gathered_params + m.gathered_grads) / 1e9;
  p.transient_gb = m.newton_schulz / 1e9;
  p.activations_gb = (m.activations + m.classifier) / 1e9;
  return m.total() / 1e9;
}

}  // namespace

namespace {

// Bounded access to the fields of one cluster JSON; every error names the file and the key
// (runtime/core/json_fields.h). Absent keys take the struct's defaults.
struct ClusterFields {
  const nlohmann::json& j;
  JsonFields<> f;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const { f.fail(key, what); }
  // A finite number in [lo, hi] (in (lo, hi] when `open_lo`); absent: `fallback`, which must obey
  // the same bounds (a required key has an invalid fallback).
  double number(const std::string& key, double fallback, double lo, double hi, bool open_lo = false) const {
    if (auto v = f.find(j, key)) return v->number(lo, hi, open_lo);
    if (std::isfinite(fallback) && fallback <= hi && (open_lo ? fallback > lo : fallback >= lo)) return fallback;
    fail(key, std::string("missing; expected a number ") + (open_lo ? "> " : ">= ") + JsonFields<>::shown(lo) +
                  " and <= " + JsonFields<>::shown(hi));
  }
  int integer(const std::string& key, int fallback, int lo, int hi) const {
    if (auto v = f.find(j, key)) return static_cast<int>(v->integer(lo, hi));
    return fallback;
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (auto v = f.find(j, key)) return v->string();
    return fallback;
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (auto v = f.find(j, key)) return v->boolean();
    return fallback;
  }
  // [[size, efficiency], ...]: at most 256 points, sizes finite and > 0 and increasing, efficiencies
  // in (0, 1.5] (curve_efficiency's rule).
  std::vector<std::pair<double, double>> curve(const std::string& key) const {
    std::vector<std::pair<double, double>> out;
    if (!j.contains(key)) return out;
    const auto& v = j.at(key);
    if (!v.is_array() || v.size() > 256) fail(key, "expected a list of at most 256 [size, efficiency] pairs");
    for (const auto& pt : v) {
      if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number())
        fail(key, "expected [size, efficiency] pairs of numbers, got " + clip_for_message(pt.dump()));
      const double size = pt[0].get<double>();
      if (!std::isfinite(size) || !(size > 0) || size > 1e9) fail(key, "size " + clip_for_message(pt[0].dump()) + " not in (0, 1e9]");
      out.emplace_back(size, pt[1].get<double>());
    }
    try {
      curve_efficiency(out, 1.0);
    } catch (const std::exception& e) {
      fail(key, e.what());
    }
    return out;
  }
};

}  // namespace

ClusterSpec ClusterSpec::load(const std::string& path) {
  const std::string text = read_input_file(path, "cluster file", size_t{16} << 20);  // regular files only
  nlohmann::json j;
  try {
    if (json_nesting_depth(text) > kMaxJsonDepth) throw std::runtime_error("nested deeper than 64 levels");
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + (dynamic_cast<const nlohmann::json::exception*>(&e) ? "invalid JSON: " : "") +
                             json_error_text(e.what()));
  }
  if (!j.is_object()) throw std::runtime_error(path + ": not a JSON object");
  const ClusterFields f{j, JsonFields<>(path)};
  ClusterSpec c;
  c.name = f.string("name", c.name);
  c.source = f.string("source", c.source);
  c.linear_latency = f.boolean("linear_latency", c.linear_latency);
  // Rates: > 0 (gemm_tflops_bf16 may be 0: the f32 rate), at most far above any device.
  c.gemm_tflops_f32 = f.number("gemm_tflops_f32", c.gemm_tflops_f32, 0, 1e5, true);
  c.gemm_tflops_bf16 = f.number("gemm_tflops_bf16", c.gemm_tflops_bf16, 0, 1e5);
  c.ns_efficiency = f.number("ns_efficiency", c.ns_efficiency, 0, 100, true);
  c.model_efficiency = f.number("model_efficiency", c.model_efficiency, 0, 100, true);
  c.mem_GBps = f.number("mem_GBps", c.mem_GBps, 0, 1e6, true);
  c.intra_GBps = f.number("intra_GBps", c.intra_GBps, 0, 1e6, true);
  c.inter_GBps = f.number("inter_GBps", c.inter_GBps, 0, 1e6, true);
  c.memory_gb = f.number("memory_gb", c.memory_gb, 0, 1e6, true);
  c.reserve_gb = f.number("reserve_gb", c.reserve_gb, 0, 1e6);
  if (c.reserve_gb >= c.memory_gb) f.fail("reserve_gb", "must be below memory_gb (" + nlohmann::json(c.memory_gb).dump() + ")");
  c.intra_latency_us = f.number("intra_latency_us", c.intra_latency_us, 0, 1e7);
  c.inter_latency_us = f.number("inter_latency_us", c.inter_latency_us, 0, 1e7);
  c.launch_us = f.number("launch_us", c.launch_us, 0, 1e6);
  c.gpus_per_node = f.integer("gpus_per_node", c.gpus_per_node, 1, 65536);
  c.cores_per_node = f.integer("cores_per_node", c.cores_per_node, 0, 1 << 20);
  c.gemm_curve_bf16 = f.curve("gemm_curve_bf16");
  c.gemm_curve_f32 = f.curve("gemm_curve_f32");
  if (!(c.gemm_tflops_bf16 > 0)) c.gemm_tflops_bf16 = c.gemm_tflops_f32;
  return c;
}

nlohmann::json ClusterSpec::to_json() const {
  return {{"name", name},           {"gemm_tflops_bf16", gemm_tflops_bf16}, {"gemm_tflops_f32", gemm_tflops_f32},
          {"ns_efficiency", ns_efficiency}, {"model_efficiency", model_efficiency}, {"mem_GBps", mem_GBps},
          {"memory_gb", memory_gb}, {"reserve_gb", reserve_gb}, {"gpus_per_node", gpus_per_node},
          {"intra_GBps", intra_GBps}, {"inter_GBps", inter_GBps}, {"intra_latency_us", intra_latency_us},
          {"inter_latency_us", inter_latency_us}, {"linear_latency", linear_latency},
          {"cores_per_node", cores_per_node}, {"gemm_curve_bf16", gemm_curve_bf16},
          {"gemm_curve_f32", gemm_curve_f32}, {"launch_us", launch_us}, {"source", source}};
}

const char* baseline_ns_name(BaselineNs b) { return b == BaselineNs::row_sharded ? "row_sharded" : "every_rank"; }

BaselineNs parse_baseline_ns(const std::string& s) {
  if (s == "every_rank") return BaselineNs::every_rank;
  if (s == "row_sharded") return BaselineNs::row_sharded;
  throw std::invalid_argument("fsdp2 baseline Newton-Schulz must be every_rank or row_sharded, got '" + s + "'");
}

int baseline_dtensor_ops(int64_t rows, int64_t cols, int steps) {
  // Per matrix: momentum lerp_, Nesterov lerp, bf16 cast, norm, clamp, div_, weight decay mul_,
  // update add_, the adjusted-lr scale (9); a tall matrix's two transposes; per iteration the Gram
  // matmul, the transpose it reads and two addmm (4).
  return 9 + (rows > cols ? 2 : 0) + 4 * std::max(0, steps);
}

DType resolve_projection_dtype(std::optional<DType> asked, const ClusterSpec& c) {
  if (asked) return *asked;
  if (c.gpu()) return DType::bf16;
  const double bf16 = c.gemm_tflops_bf16 > 0 ? c.gemm_tflops_bf16 : c.gemm_tflops_f32;  // 0: the f32 rate
  return bf16_pays({c.gemm_tflops_f32, bf16}) ? DType::bf16 : DType::f32;
}

std::string BaselineOptions::describe(DType ns_dtype, int ns_steps_default) const {
  std::string s = std::string("fsdp2 baseline: ") + baseline_ns_name(ns) + " Newton-Schulz, gather " +
                  dtype_name(gather_dtype.value_or(ns_dtype)) + ", NS " + std::to_string(ns_steps.value_or(ns_steps_default));
  if (ns == BaselineNs::row_sharded)
    s += ", " + std::to_string(static_cast<int>(host_op_us)) + " us host dispatch per DTensor op";
  return s;
}

nlohmann::json Projection::to_json() const {
  return {{"world", world},           {"replicas", replicas},         {"forward_ms", forward_ms},
          {"backward_ms", backward_ms}, {"reduce_ms", reduce_ms},     {"optimizer_ms", optimizer_ms},
          {"step_ms", step_ms},       {"ns_ms", ns_ms}, {"elementwise_ms", elementwise_ms},
          {"opt_comm_ms", opt_comm_ms}, {"host_ms", host_ms}, {"exposed_gather_ms", exposed_gather_ms},
          {"persistent_gb", persistent_gb}, {"gathered_gb", gathered_gb},
          {"activations_gb", activations_gb}, {"transient_gb", transient_gb}, {"total_gb", total_gb},
          {"oom", oom}};
}

int64_t ModelProfile::num_params() const {
  int64_t n = 0;
  for (const auto& p : inventory.params) n += p.numel();
  return n;
}

double ModelProfile::flops_per_token(int context) const {
  return matmul_flops_per_token + 12.0 * n_layer * n_embd * static_cast<double>(context);
}


namespace {

// Forward compute of each unit, seconds: its matrices' GEMMs, the attention products (block
// units) and the rest of the model's FLOPs (head) on the last unit, / model_efficiency.
std::vector<double> unit_forward_seconds(const ProjectionInput& in, const ClusterSpec& c, double share, size_t U) {
  const ModelProfile& m = in.model;
  const double tokens = static_cast<double>(in.batch) * in.seq;
  std::vector<double> f(U, 0.0);
  double matrix_flops = 0;
  for (const ParamSpec& p : m.inventory.params) {
    if (p.role != ParamRole::matrix || p.shape.size() != 2) continue;
    f[static_cast<size_t>(p.unit)] += gemm_seconds(c, in.dtype, 1, tokens, static_cast<double>(p.shape[0]),
                                                   static_cast<double>(p.shape[1]), share);
    matrix_flops += 2.0 * tokens * static_cast<double>(p.numel());
  }
  // Attention: Q K^T and P V per head, 4 T C FLOPs per token per layer (1/3 of PaLM's 12 L C T).
  const int heads = std::max(1, m.n_head);
  const double hd = static_cast<double>(m.n_embd) / heads, T = in.seq;
  const double attention = 2 * gemm_seconds(c, in.dtype, static_cast<double>(in.batch) * heads, T, T, hd, share);
  const bool blocks = U >= 3 && m.n_layer > 0;
  for (size_t u = blocks ? 1 : 0; u < (blocks ? U - 1 : U); ++u)
    f[u] += attention * m.n_layer / static_cast<double>(blocks ? U - 2 : U);
  const double rest = m.flops_per_token(in.seq) / 3 * tokens - matrix_flops - 4.0 * m.n_layer * m.n_embd * T * tokens;
  if (rest > 0 && m.n_embd > 0)  // the head's GEMM (and any other matmul FLOPs) at a [tokens, C] x [C, rest] shape
    f[U - 1] += gemm_seconds(c, in.dtype, 1, tokens, rest / (2 * tokens * m.n_embd), m.n_embd, share);
  for (double& x : f) x /= c.model_efficiency;
  return f;
}

// Seconds of fsdp2's row-sharded Newton-Schulz of one rows x cols matrix over S ranks (BaselineNs).
// Its collectives are the ones torch.optim.Muon issues on FSDP2's Shard(0) DTensors (torch 2.15,
// logged per call at 8 ranks of a fake process group by scripts/muon_dtensor_collectives.py):
// one scalar all-reduce for the Frobenius norm; per iteration, a tall matrix all-reduces an
// m x m matrix twice (the Gram X X^T stays Partial(sum): the first addmm all-reduces it as its
// left factor and leaves gram_update Partial, which the second addmm all-reduces), a wide or
// square one all-gathers X, A and X.
double row_sharded_seconds(const ClusterSpec& c, DType dt, int64_t rows, int64_t cols, int steps,
                           int S, double share, const std::function<double(double)>& gather,
                           const std::function<double(double)>& all_reduce) {
  const double m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  const double e = dtype_bytes(dt), launch = c.launch_us * 1e-6;
  double it = 0;
  if (rows > cols) {  // transposed to [m, n], sharded along n: X X^T partial sums, A A whole
    it = gemm_seconds(c, dt, 1, m, m, n / S, share) + 2 * all_reduce(m * m * e) +
         gemm_seconds(c, dt, 1, m, m, m, share) + gemm_seconds(c, dt, 1, m, n / S, m, share);
  } else {  // sharded along m: X, A and X gathered for the three products
    it = gather(m * n * e) + gemm_seconds(c, dt, 1, m / S, m, n, share) + gather(m * m * e) +
         gemm_seconds(c, dt, 1, m / S, m, m, share) + gather(m * n * e) + gemm_seconds(c, dt, 1, m / S, n, m, share);
  }
  return all_reduce(e) + kNsNormalizeLaunches * launch + steps * (it + kNsExtraLaunchesPerIteration * launch);
}

// The optimizer step of the slowest rank (Newton-Schulz + elementwise) and the step's
// collectives into p.
void optimizer_terms(const ProjectionInput& in, const ClusterSpec& c, const ShardPlan& plan, const Cost& cost,
                     bool batch_orthogonalize, Projection& p) {
  const int S = plan.world_size;
  const PlacementTraits traits = placement_traits(in.placement);
  const bool in_node = S <= c.gpus_per_node, fsdp2 = traits.gathered_muon_input;  // the fsdp2 baseline
  const int steps = fsdp2 ? in.baseline.ns_steps.value_or(plan.options.ns_steps) : plan.options.ns_steps;
  const bool batched = !traits.every_rank_orthogonalizes() && batch_orthogonalize;
  const bool row_sharded = fsdp2 && in.baseline.ns == BaselineNs::row_sharded;
  const std::function<double(double)> gather = [&](double b) { return cost.coll(b * (S - 1) / S, S, in_node); };
  const std::function<double(double)> all_reduce = [&](double b) { return cost.coll(2 * b * (S - 1) / S, S, in_node); };
  const std::function<double(double)> free = [](double) { return 0.0; };
  double ns = 0, elem = 0, comm = 0, host = 0;
  for (const RankWork& w : rank_work(plan)) {
    double t = 0, exchange = 0, dispatch = 0;
    for (const auto& [shape, count] : w.matrices) {
      if (!row_sharded) {
        t += newton_schulz_seconds(c, in.ns_dtype, shape.first, shape.second, steps, count, batched, cost.share());
        continue;
      }
      const double alone = row_sharded_seconds(c, in.ns_dtype, shape.first, shape.second, steps, S, cost.share(), free, free);
      t += count * alone;
      dispatch += count * in.baseline.host_op_us * 1e-6 * baseline_dtensor_ops(shape.first, shape.second, steps);
      exchange += count * (row_sharded_seconds(c, in.ns_dtype, shape.first, shape.second, steps, S, cost.share(),
                                               gather, all_reduce) - alone);
    }
    const double el = (w.adamw_elems * kAdamWBytesPerElement + w.muon_elems * kMuonElementwiseBytes) /
                      (c.mem_GBps * 1e9 * cost.share());
    if (t + el + exchange + dispatch > ns + elem + comm + host) ns = t, elem = el, comm = exchange, host = dispatch;
  }
  if (fsdp2 && !row_sharded) {
    const double eg = dtype_bytes(in.baseline.gather_dtype.value_or(in.ns_dtype));
    for (const MatrixShard& s : plan.shards)
      if (s.optimizer == OptimizerKind::muon)
        comm += cost.coll(static_cast<double>(s.fsdp2_slot_numel(S)) * (S - 1) * eg, S, in_node);
  }
  if (traits.gather_after_step)
    for (const UnitLayout& u : plan.units) comm += cost.coll(static_cast<double>(u.total_numel()) * 4 * (S - 1) / S, S, in_node);
  p.ns_ms = 1e3 * ns;
  p.elementwise_ms = 1e3 * elem;
  p.opt_comm_ms = 1e3 * comm;
  p.host_ms = 1e3 * host;
  p.optimizer_ms = p.ns_ms + p.elementwise_ms + p.opt_comm_ms + p.host_ms;
}

}  // namespace

Projection project(const ProjectionInput& in, const ClusterSpec& cluster, int world, const EngineChoices& engine) {
  const int R = in.replicas;
  if (R < 1 || world % R != 0)
    throw std::invalid_argument("projection: replicas " + std::to_string(R) + " must divide world " +
                                std::to_string(world));
  const int S = world / R;
  const Cost cost{cluster, world};
  const double e = dtype_bytes(in.dtype);
  dtype_bytes(in.ns_dtype);
  const ShardPlan plan = make_plan(in.model.inventory, S, in.placement, engine.planner);
  const PlacementTraits traits = placement_traits(in.placement);
  const bool shard_in_node = S <= cluster.gpus_per_node, world_in_node = world <= cluster.gpus_per_node;
  Projection p;
  p.world = world;
  p.replicas = R;
  const std::vector<double> fwd = unit_forward_seconds(in, cluster, cost.share(), plan.units.size());
  std::vector<UnitTimes> units(plan.units.size());
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const double bytes = static_cast<double>(plan.units[i].total_numel()) * e;
    UnitTimes& u = units[i];
    u.forward = fwd[i];
    u.backward = fwd[i] * (in.activation_checkpointing ? 3.0 : 2.0);
    if (!traits.resident) u.gather = cost.coll(bytes * (S - 1) / S, S, shard_in_node);
    if (traits.all_reduce_gradients) {
      u.reduce = cost.coll(2.0 * bytes * (world - 1) / world, world, world_in_node);
    } else {
      u.reduce = R * cost.coll(bytes * (S - 1) / S, S, shard_in_node);
      if (R > 1)  // the replica chain: R - 1 hops of the owned shard, then a broadcast from the last replica
        u.reduce += (R - 1) * cost.coll(bytes / S, 2, world_in_node) + cost.coll(bytes / S, R, world_in_node);
    }
  }
  const UnitSchedule sched = schedule_units(units, engine.prefetch_depth, engine.overlap_reduce);
  double compute = 0;
  for (const UnitTimes& u : units) compute += u.forward + u.backward;
  p.forward_ms = 1e3 * sched.forward;
  p.backward_ms = 1e3 * sched.backward;
  p.reduce_ms = 1e3 * sched.reduce_wait;
  p.exposed_gather_ms = 1e3 * (sched.forward + sched.backward - compute);
  optimizer_terms(in, cluster, plan, cost, engine.batch_orthogonalize, p);
  p.step_ms = p.forward_ms + p.backward_ms + p.reduce_ms + p.optimizer_ms;
  p.total_gb = memory_gb(in, plan, engine, p);
  p.oom = memory_needed(p.total_gb, cluster.gpu() ? 0.0 : kCpuProcessBytes / 1e9) > cluster.memory_gb - cluster.reserve_gb;
  return p;
}

}  // namespace mfsdp
