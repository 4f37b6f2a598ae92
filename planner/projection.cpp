#include "planner/projection.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

#include "planner/cost_model.h"
#include "planner/planner.h"

namespace mfsdp {
namespace {

double dtype_bytes(const std::string& d) {
  if (d == "f32") return 4;
  if (d == "bf16") return 2;
  throw std::invalid_argument("projection: dtype must be bf16 or f32, got '" + d + "'");
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
  double rate(const std::string& dtype) const {
    return (dtype == "f32" ? c.gemm_tflops_f32 : c.gemm_tflops_bf16) * 1e12 * share();
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

struct RankWork {
  double muon_flops = 0, muon_elems = 0, adamw_elems = 0, persistent = 0;
};

// Per rank: optimizer work and persistent bytes under the plan (see project()).
std::vector<RankWork> rank_work(const ShardPlan& plan, const PlannerOptions& po) {
  const int N = plan.world_size;
  std::vector<RankWork> w(static_cast<size_t>(N));
  double all_muon = 0;
  int64_t total = 0;
  for (const MatrixShard& s : plan.shards) {
    const bool muon = s.optimizer == OptimizerKind::muon;
    const double mf = shard_muon_flops(s, po);
    all_muon += mf;
    total += s.numel();
    for (const ShardPiece& p : s.pieces) {
      const std::vector<int> ranks = plan.placement == Placement::ddp ? std::vector<int>{} : std::vector<int>{p.rank};
      for (int r : ranks) {
        RankWork& x = w[static_cast<size_t>(r)];
        (muon ? x.muon_elems : x.adamw_elems) += static_cast<double>(p.numel);
        if (muon && plan.placement != Placement::fsdp2) x.muon_flops += mf;
        const double per = static_cast<double>(owner_bytes_per_element(s.optimizer));
        x.persistent += static_cast<double>(p.numel) * (plan.placement == Placement::zero1 ? per - 8 : per);
      }
    }
    if (plan.placement == Placement::ddp)
      for (RankWork& x : w) {
        (muon ? x.muon_elems : x.adamw_elems) += static_cast<double>(s.numel());
        x.persistent += static_cast<double>(s.numel() * owner_bytes_per_element(s.optimizer));
      }
  }
  for (RankWork& x : w) {
    if (plan.placement == Placement::fsdp2 || plan.placement == Placement::ddp) x.muon_flops = all_muon;
    if (plan.placement == Placement::zero1) x.persistent += 8.0 * static_cast<double>(total);
  }
  return w;
}

double memory_gb(const ProjectionInput& in, const ShardPlan& plan, double persistent, Projection& p) {
  const double e = dtype_bytes(in.dtype);
  const bool resident = in.placement == Placement::zero1 || in.placement == Placement::ddp;
  const auto& U = plan.units;
  double pair = 0, largest_matrix = 0;
  for (size_t u = 0; u < U.size(); ++u) {
    const double next = u + 1 < U.size() ? static_cast<double>(U[u + 1].total_numel()) : 0.0;
    pair = std::max(pair, static_cast<double>(U[u].total_numel()) + next);
  }
  pair = std::max(pair, static_cast<double>(U.front().total_numel() + U.back().total_numel()));
  for (const MatrixShard& s : plan.shards)
    if (s.optimizer == OptimizerKind::muon) largest_matrix = std::max(largest_matrix, static_cast<double>(s.numel()));
  const double tokens = static_cast<double>(in.batch) * in.seq;
  const double layer_act = in.model.activation_bytes_per_token_layer(in.seq) * e / 4.0 * tokens;
  const double act = in.activation_checkpointing
                         ? in.model.n_layer * tokens * in.model.n_embd * e + layer_act
                         : in.model.n_layer * layer_act;
  p.persistent_gb = persistent / 1e9;
  p.gathered_gb = resident ? 0.0 : pair * 2 * e / 1e9;
  p.transient_gb = (in.placement == Placement::fsdp2 ? 3 * 4 * largest_matrix : 0.0) / 1e9;
  p.activations_gb = (act + tokens * static_cast<double>(in.model.vocab) * 4 * 2) / 1e9;
  return p.persistent_gb + p.gathered_gb + p.transient_gb + p.activations_gb;
}

}  // namespace

ClusterSpec ClusterSpec::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open cluster file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  ClusterSpec c;
  c.name = j.value("name", c.name);
#define MFSDP_CLUSTER_KEY(k) c.k = j.value(#k, c.k)
  MFSDP_CLUSTER_KEY(gemm_tflops_bf16); MFSDP_CLUSTER_KEY(gemm_tflops_f32); MFSDP_CLUSTER_KEY(ns_efficiency);
  MFSDP_CLUSTER_KEY(model_efficiency); MFSDP_CLUSTER_KEY(mem_GBps); MFSDP_CLUSTER_KEY(memory_gb);
  MFSDP_CLUSTER_KEY(reserve_gb); MFSDP_CLUSTER_KEY(gpus_per_node); MFSDP_CLUSTER_KEY(intra_GBps);
  MFSDP_CLUSTER_KEY(inter_GBps); MFSDP_CLUSTER_KEY(intra_latency_us); MFSDP_CLUSTER_KEY(inter_latency_us);
  MFSDP_CLUSTER_KEY(linear_latency); MFSDP_CLUSTER_KEY(cores_per_node);
#undef MFSDP_CLUSTER_KEY
  for (double v : {c.gemm_tflops_f32, c.mem_GBps, c.intra_GBps, c.inter_GBps, c.ns_efficiency, c.model_efficiency})
    if (!(v > 0)) throw std::runtime_error(path + ": gemm_tflops_f32, mem_GBps, intra_GBps, inter_GBps and the "
                                                  "efficiencies must be > 0");
  if (!(c.gemm_tflops_bf16 > 0)) c.gemm_tflops_bf16 = c.gemm_tflops_f32;
  if (c.gpus_per_node < 1) throw std::runtime_error(path + ": gpus_per_node must be >= 1");
  return c;
}

nlohmann::json ClusterSpec::to_json() const {
  return {{"name", name},           {"gemm_tflops_bf16", gemm_tflops_bf16}, {"gemm_tflops_f32", gemm_tflops_f32},
          {"ns_efficiency", ns_efficiency}, {"model_efficiency", model_efficiency}, {"mem_GBps", mem_GBps},
          {"memory_gb", memory_gb}, {"reserve_gb", reserve_gb}, {"gpus_per_node", gpus_per_node},
          {"intra_GBps", intra_GBps}, {"inter_GBps", inter_GBps}, {"intra_latency_us", intra_latency_us},
          {"inter_latency_us", inter_latency_us}, {"linear_latency", linear_latency},
          {"cores_per_node", cores_per_node}};
}

nlohmann::json Projection::to_json() const {
  return {{"world", world},           {"replicas", replicas},         {"forward_ms", forward_ms},
          {"backward_ms", backward_ms}, {"reduce_ms", reduce_ms},     {"optimizer_ms", optimizer_ms},
          {"step_ms", step_ms},       {"persistent_gb", persistent_gb}, {"gathered_gb", gathered_gb},
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

double ModelProfile::activation_bytes_per_token_layer(int context) const {
  return 2.0 * (34.0 * n_embd + 5.0 * n_head * static_cast<double>(context));
}

Projection project(const ProjectionInput& in, const ClusterSpec& cluster, int world) {
  const int R = in.replicas;
  if (R < 1 || world % R != 0 || (R > 1 && in.placement == Placement::ddp))
    throw std::invalid_argument("projection: replicas " + std::to_string(R) + " must divide world " +
                                std::to_string(world) + " (and ddp is not replicated)");
  const int S = world / R;
  const Cost cost{cluster, world};
  const double e = dtype_bytes(in.dtype), ens = dtype_bytes(in.ns_dtype);
  const PlannerOptions po{in.ns_steps, false, false};
  const ShardPlan plan = make_plan(in.model.inventory, S, in.placement, po);
  const bool resident = in.placement == Placement::zero1 || in.placement == Placement::ddp;
  const bool shard_in_node = S <= cluster.gpus_per_node, world_in_node = world <= cluster.gpus_per_node;
  Projection p;
  p.world = world;
  p.replicas = R;
  const double flops = in.model.flops_per_token(in.seq) * in.batch * in.seq / (cost.rate(in.dtype) * cluster.model_efficiency);
  double gather = 0, reduce = 0;
  for (const UnitLayout& u : plan.units) {
    const double bytes = static_cast<double>(u.total_numel()) * e;
    if (!resident) gather += cost.coll(bytes * (S - 1) / S, S, shard_in_node);
    if (in.placement == Placement::ddp) {
      reduce += cost.coll(2.0 * bytes * (world - 1) / world, world, world_in_node);
      continue;
    }
    reduce += R * cost.coll(bytes * (S - 1) / S, S, shard_in_node);
    if (R > 1)  // the replica chain: R - 1 hops of the owned shard, then a broadcast from the last replica
      reduce += (R - 1) * cost.coll(bytes / S, 2, world_in_node) + cost.coll(bytes / S, R, world_in_node);
  }
  p.forward_ms = 1e3 * (flops / 3 + gather);
  p.backward_ms = 1e3 * (flops * (in.activation_checkpointing ? 1.0 : 2.0 / 3.0) + gather);
  p.reduce_ms = 1e3 * reduce;
  double opt = 0, persistent = 0;
  for (const RankWork& w : rank_work(plan, po)) {
    const double t = w.muon_flops / (cost.rate(in.ns_dtype) * cluster.ns_efficiency) +
                     (w.adamw_elems * kAdamWBytesPerElement + w.muon_elems * kMuonElementwiseBytes) /
                         (cluster.mem_GBps * 1e9 * cost.share());
    opt = std::max(opt, t);
    persistent = std::max(persistent, w.persistent);
  }
  if (in.placement == Placement::fsdp2)
    for (const MatrixShard& s : plan.shards)
      if (s.optimizer == OptimizerKind::muon)
        opt += cost.coll(static_cast<double>(s.fsdp2_slot_numel(S)) * (S - 1) * ens, S, shard_in_node);
  if (in.placement == Placement::zero1)
    for (const UnitLayout& u : plan.units)
      opt += cost.coll(static_cast<double>(u.total_numel()) * 4 * (S - 1) / S, S, shard_in_node);
  p.optimizer_ms = 1e3 * opt;
  p.step_ms = p.forward_ms + p.backward_ms + p.reduce_ms + p.optimizer_ms;
  p.total_gb = memory_gb(in, plan, persistent, p);
  p.oom = p.total_gb > cluster.memory_gb - cluster.reserve_gb;
  return p;
}

}  // namespace mfsdp
