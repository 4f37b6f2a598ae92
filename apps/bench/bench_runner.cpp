#include "apps/bench/bench_runner.h"

#include <algorithm>
#include <stdexcept>

#include "models/gpt.h"
#include "models/llama.h"
#include "models/moe.h"
#include "planner/memory_plan.h"
#include "planner/planner.h"
#include "runtime/engine/sharded_engine.h"
#include "runtime/memory.h"
#include "runtime/ops.h"

namespace mfsdp {

const std::vector<std::string>& bench_time_phases() {
  static const std::vector<std::string> p{"forward", "backward", "reduce", "optimizer", "total"};
  return p;
}

const std::vector<std::string>& bench_memory_categories() {
  static const std::vector<std::string> c{"params",         "grads",       "opt_state",    "persistent", "gathered_params",
                                          "gathered_grads", "activations", "comm_buffers", "planned",
                                          "total"};
  return c;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json BenchResult::to_json() const {
  nlohmann::json j{{"model", c.model.name},        {"placement", placement_name(c.placement)},
                   {"ns_steps", c.ns_steps},       {"dtype", dtype_name(c.dtype)},
                   {"batch", c.batch},             {"seq", c.seq},
                   {"layers", c.model.n_layer},    {"vocab", c.model.vocab},
                   {"params", c.model.num_params()},
                   {"warmup", c.warmup},           {"steps", c.steps},
                   {"world", world},               {"replicas", c.replicas},
                   {"family", c.model.family},     {"batch_orthogonalize", kToggleNames.name(c.batch_orthogonalize)},
                   {"expert_parallel", c.expert_parallel},
                   {"tokens_per_second", tokens_per_second}, {"loss", loss}};
  for (size_t i = 0; i < ms.size(); ++i) j["ms"][bench_time_phases()[i]] = ms[i];
  for (size_t i = 0; i < bytes.size(); ++i) j["bytes"][comm_phase_name(static_cast<CommPhase>(i))] = bytes[i];
  for (size_t i = 0; i < mib.size(); ++i) j["mib"][bench_memory_categories()[i]] = mib[i];
  return j;
}

namespace {

std::vector<double> max_over(Communicator& comm, Communicator* replica, std::vector<double> v) {
  for (double& x : v) {
    x = comm.all_reduce_scalar(x, ReduceOp::max, CommPhase::other);
    if (replica) x = replica->all_reduce_scalar(x, ReduceOp::max, CommPhase::other);
  }
  return v;
}

std::vector<double> phase_bytes(const CommCounters& a, const CommCounters* b, int steps) {
  std::vector<double> out;
  for (int p = 0; p < static_cast<int>(CommPhase::count); ++p) {
    PhaseCounters c = a.phase[p];
    if (b) c += b->phase[p];
    out.push_back(static_cast<double>(c.bytes_sent + c.bytes_received) / steps);
  }
  return out;
}

// The runnable model of `m`'s family with a context of at least `seq` tokens.
std::unique_ptr<UnitModel> make_bench_model(ModelShape m, int seq) {
  m.seq_len = std::max(seq, m.seq_len);
  if (m.family == "llama") return std::make_unique<Llama>(m.llama_config());
  if (m.family == "qwen2_moe") return std::make_unique<MoeTransformer>(m.moe_config());
  return std::make_unique<GPT>(m.gpt_config());
}

// This rank's memory plan (planner/memory_plan.h) for the case, with the options the engine resolves.
double planned_bytes(const UnitModel& model, const ShardPlan& plan, const EngineOptions& opts, const BenchCase& c, int rank) {
  const ResolvedOptions r = resolve(opts, Device::CPU, c.placement, c.replicas, model_facts(model));
  int64_t padded_vocab = 0;
  for (const ParamSpec& p : model.inventory().params)
    if (p.role == ParamRole::embedding && p.shape.size() == 2) padded_vocab = std::max(padded_vocab, p.shape[0]);
  MemoryPlanOptions o;
  o.micro_batch = c.batch;
  o.seq = c.seq;
  o.prefetch_depth = r.prefetch_depth();
  o.overlap_reduce = r.overlap_reduce();
  o.batch_orthogonalize = r.batch_orthogonalize();
  return plan_memory(plan, {c.model.n_layer, c.model.n_embd, c.model.n_head, padded_vocab}, o, rank).total();
}

}  // namespace

BenchResult run_bench_case(Communicator& comm, Communicator* replica, const BenchCase& c) {
  if (c.dtype != DType::f32)
    throw std::invalid_argument(std::string("mfsdp-bench: dtype ") + dtype_name(c.dtype) + " is not available on CPU (f32 only)");
  if (c.batch < 1 || c.seq < 1 || c.steps < 1 || c.warmup < 0) throw std::invalid_argument("mfsdp-bench: bad sizes");
  BenchResult res;
  res.c = c;
  res.world = comm.world_size() * (replica ? replica->world_size() : 1);
  const int rank = comm.rank() + (replica ? replica->rank() * comm.world_size() : 0);
  auto& mt = MemoryTracker::instance();
  std::vector<std::vector<double>> times(bench_time_phases().size());
  std::vector<double> peaks;
  {
    const std::unique_ptr<UnitModel> built = make_bench_model(c.model, c.seq);
    UnitModel& model = *built;
    PlannerOptions popt;
    popt.ns_steps = c.ns_steps;
    popt.node_of_rank = c.node_of_rank;
    popt.expert_parallel = c.expert_parallel;
    const ShardPlan plan = make_plan(model.inventory(), comm.world_size(), c.placement, popt);
    EngineOptions opts;
    opts.muon.ns_steps = c.ns_steps;
    opts.batch_orthogonalize = c.batch_orthogonalize;
    opts.expert_parallel = c.expert_parallel;
    mt.reset_peaks();
    ShardedEngine engine(model, comm, plan, opts, replica);
    engine.init_parameters(1);
    std::vector<int32_t> tok(static_cast<size_t>(c.batch) * c.seq), tgt(tok.size());
    for (size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<int32_t>((i * 31 + static_cast<size_t>(rank) * 7) % c.model.vocab);
      tgt[i] = static_cast<int32_t>((i * 17 + 1) % c.model.vocab);
    }
    const std::vector<MicroBatch> micro{{tokens_tensor(tok, {c.batch, c.seq}), tokens_tensor(tgt, {c.batch, c.seq})}};
    for (int s = 0; s < c.warmup; ++s) engine.train_step(micro, s);
    comm.reset_counters();
    if (replica) replica->reset_counters();
    for (int s = 0; s < c.steps; ++s) {
      const StepStats st = engine.train_step(micro, c.warmup + s);
      const double t[] = {st.seconds.forward, st.seconds.backward, st.seconds.reduce, st.seconds.optimizer, st.seconds.total};
      for (size_t i = 0; i < times.size(); ++i) times[i].push_back(1e3 * t[i]);
      res.loss = st.loss;
    }
    res.bytes = phase_bytes(comm.counters(), replica ? &replica->counters() : nullptr, c.steps);
    const MemCategory cats[] = {MemCategory::parameters,     MemCategory::gradients,      MemCategory::optimizer_state,
                                MemCategory::gathered_params, MemCategory::gathered_grads, MemCategory::activations,
                                MemCategory::comm_buffers};
    for (MemCategory m : cats) peaks.push_back(static_cast<double>(mt.peak(Device::CPU, m)) / (1024.0 * 1024.0));
    peaks.insert(peaks.begin() + 3, peaks[0] + peaks[1] + peaks[2]);
    peaks.push_back(planned_bytes(model, plan, opts, c, comm.rank()) / (1024.0 * 1024.0));
    peaks.push_back(static_cast<double>(mt.peak_total(Device::CPU)) / (1024.0 * 1024.0));
  }
  res.bytes = max_over(comm, replica, res.bytes);
  res.mib = max_over(comm, replica, peaks);
  for (auto& t : times) res.ms.push_back(median(t));
  const double tokens = static_cast<double>(res.world) * c.batch * c.seq;
  res.tokens_per_second = res.ms.back() > 0 ? tokens / (res.ms.back() / 1e3) : 0;
  return res;
}

}  // namespace mfsdp
