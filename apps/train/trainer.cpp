// The training loop of mfsdp-train, in the shape of llm.c's: take the next batches, take a step,
// log, maybe evaluate, maybe checkpoint, maybe stop. Set-up, evaluation and the end of a run
// (final validation, sample, export, summary) are the Trainer's other methods.
#include "apps/train/trainer.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "apps/train/checkpointing.h"
#include "apps/train/memory_check.h"
#include "apps/train/model_io.h"
#include "apps/train/preemption.h"
#include "apps/train/preflight.h"
#include "apps/train/run_log.h"
#include "apps/train/run_precision.h"
#include "apps/train/trace_window.h"
#include "models/model_common.h"
#include "planner/planner.h"
#include "runtime/core/clock.h"
#include "runtime/core/cpu_affinity.h"
#include "runtime/core/format_bytes.h"
#include "runtime/cpu_gemm_bf16.h"
#include "runtime/kernels.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/tokenizer.h"
#include "runtime/engine/sharded_engine.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

// The planner's options for this run; owners spread over the nodes when the shard group is the
// whole world (with replicas, each shard group's layout over nodes is HSDP's).
PlannerOptions plan_options(const TrainConfig& cfg, const UnitModel& units, const TrainerOptions& opts, int world) {
  PlannerOptions o = planner_options(cfg.optim, units);
  if (!opts.replicas && static_cast<int>(opts.topology.node_of_rank.size()) == world)
    o.node_of_rank = opts.topology.node_of_rank;
  return o;
}

using json = nlohmann::json;

// Validation loss over an EvalSplit: every rank runs the same number of batches.
double evaluate(ShardedEngine& engine, const EvalSplit& split, int B, int T) {
  std::vector<MicroBatch> batches;
  std::vector<int32_t> in(static_cast<size_t>(B) * T), tgt(static_cast<size_t>(B) * T);
  const int64_t n = split.num_batches_all_ranks(B);
  for (int64_t b = 0; b < n; ++b) {
    const int64_t rows = split.batch(b, B, in.data(), tgt.data());
    batches.push_back({tokens_tensor(std::vector<int32_t>(in.begin(), in.begin() + rows * T), {rows, T}),
                       tokens_tensor(std::vector<int32_t>(tgt.begin(), tgt.begin() + rows * T), {rows, T})});
  }
  auto [sum, count] = engine.eval_loss_sum(batches);
  return count > 0 ? sum / static_cast<double>(count) : std::nan("");
}

class Trainer {
 public:
  Trainer(const TrainConfig& cfg, Communicator& comm, const TrainerOptions& opts, const RunPrecision& precision);
  void evaluate_only();
  void train();

 private:
  std::vector<MicroBatch> next_batches();
  double run_eval(int64_t step, const EvalSplit& split);
  bool maybe_evaluate(int64_t step, bool last);
  int any_rank_preempted();
  void wait_for_lead_io(Communicator& group, int64_t bytes, const std::string& what);
  void log_progress(int64_t step, const StepStats& s);
  nlohmann::json global_expert_load();
  void save(int64_t step);
  void finish(bool preempted);
  void print_sample();
  void export_model(int64_t final_step);
  void write_summary(double train_seconds, const CommCounters& counters, const std::vector<double>& peaks,
                     double peak_total);

  const TrainConfig& cfg_;
  const RunPrecision precision_;
  Communicator& comm_;
  TrainerOptions opts_;
  const int rank_, world_;  ///< over every replica (HSDP: g = replica * S + shard rank, R * S); else comm_'s
  const int B_, T_, A_;
  const bool lead_;
  std::unique_ptr<TrainableModel> model_;
  std::unique_ptr<UnitModel> wrapped_;  ///< opts.wrap_units(model_->units()), or null
  UnitModel& units_;                    ///< what the engine trains: *wrapped_ or model_->units()
  ShardPlan plan_;
  /// This rank's memory plan, checked against the node before the engine allocates (memory_check.h).
  MemoryPlan memory_plan_;
  TraceWindow trace_;  ///< logging.trace: before the engine, which trains over trace_.engine_comm()
  ShardedEngine engine_;
  DataLoader loader_;
  std::string ckpt_root_;
  std::optional<CheckpointManifest> resumed_;
  nlohmann::json data_files_;  ///< rank 0: data_fingerprints(cfg) for the manifests it writes
  std::unique_ptr<EvalSplit> val_full_, val_periodic_;
  RunLog log_;

  // progress of this process
  int64_t start_step_ = 0, steps_done_ = 0, tokens_seen_ = 0, start_tokens_ = 0, last_saved_ = -1;
  double t_train_ = 0, eval_seconds_ = 0;
  double final_train_loss_ = std::nan(""), best_val_ = std::nan(""), last_val_ = std::nan("");
  double time_to_target_ = std::nan("");
  bool reached_target_ = false;
  std::vector<double> opt_seconds_;
  double phase_[4] = {0, 0, 0, 0};  // forward, backward, reduce, optimizer (max over ranks per step)
  ProgressWindow window_;
};

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, const TrainerOptions& opts, const RunPrecision& precision)
    : cfg_(cfg), precision_(precision), comm_(comm), opts_(opts),
      rank_(comm.rank() + (opts.replicas ? opts.replicas->rank() * comm.world_size() : 0)),
      world_(comm.world_size() * (opts.replicas ? opts.replicas->world_size() : 1)),
      B_(cfg.training.micro_batch_size), T_(cfg.model.seq_len), A_(cfg.training.grad_accum), lead_(rank_ == 0),
      model_(make_trainable_model(cfg)),
      wrapped_(opts.wrap_units ? opts.wrap_units(model_->units()) : nullptr),
      units_(wrapped_ ? *wrapped_ : model_->units()),
      plan_(make_plan(units_.inventory(), comm.world_size(), cfg.sharding.placement,
                      plan_options(cfg, units_, opts, comm.world_size()))),
      memory_plan_(check_memory_plan(
          cfg, comm, opts.replicas, plan_, model_->memory_model(),
          memory_plan_options(cfg, resolve(cfg.optim, comm.device(), cfg.sharding.placement, cfg.sharding.replicate,
                                            model_facts(units_)),
                              precision.matmul),
          opts.topology.local_size, [&](Placement p, int w) {
            return make_plan(units_.inventory(), w, p, plan_options(cfg, units_, opts, w));
          })),
      trace_(cfg, comm, opts.replicas),
      engine_(units_, trace_.engine_comm(), plan_, cfg.optim, trace_.engine_replicas()),
      loader_(cfg.data.train.resolved, B_, T_, rank_, world_, A_, cfg.data.shuffle,
              static_cast<uint64_t>(cfg.data.seed), cfg.model.vocab_size),
      ckpt_root_(cfg.checkpoint.root(cfg.logging.run_dir.resolved)),
      log_(cfg.logging.run_dir.resolved, rank_ == 0) {
  if (!cfg.model.init_from.resolved.empty()) engine_.load_parameters(model_->open_weights(cfg.model.init_from.resolved));
  else engine_.init_parameters(static_cast<uint64_t>(cfg.training.seed));
  resumed_ = resume_run(cfg, ckpt_root_, engine_, loader_, lead_);
  if (lead_ && !ckpt_root_.empty()) data_files_ = data_fingerprints(cfg);
  const auto& st = plan_.stats;
  if (lead_) {
    spdlog::info("MatrixFSDP | {}", model_->describe());
    spdlog::info("placement {} on {} rank(s) x {} replica(s), {} backend on {} | Muon: {} matrices ({:.2f}M) | AdamW: {} tensors "
                 "({:.2f}M) | optimizer FLOPs max/mean {:.2f}, bytes max/mean {:.2f}, empty segments {}",
                 placement_name(plan_.placement), comm.world_size(), world_ / comm.world_size(), comm.backend_name(),
                 device_name(comm.device()),
                 st.muon_params, st.muon_numel / 1e6, st.adamw_params, st.adamw_numel / 1e6, st.flops_ratio(),
                 st.bytes_ratio(), st.empty_segments);
    spdlog::info("precision: parameters {}, matmuls {}{}, gradient reduction {}, master weights and optimizer state "
                 "f32 | activation recompute: {} | attention: {} | reduce overlap: {}",
                 dtype_name(cfg.optim.param_dtype), dtype_name(cfg.optim.matmuls()),
                 cfg.optim.matmuls() == DType::bf16 && comm.device() == Device::CPU
                     ? fmt::format(" ({})", cpu_gemm_bf16_path()) : "",
                 dtype_name(cfg.optim.reduce_dtype),
                 kRecomputeNames.name(cfg.optim.recompute_units),
                 kAttentionKernelNames.name(engine_.attention()), engine_.overlap_reduce() ? "on" : "off");
    spdlog::info("{}", describe_precision(precision_, cfg));
    for (const std::string& n : precision_.notices) spdlog::info("{}", n);
    spdlog::info("the {} rank(s) agree on config, build and inputs (checked in {:.3f} s); collective timeout {} | "
                 "CPU threads per rank {} (rank 0 may run on CPUs {})",
                 world_, opts.agreement_seconds,
                 cfg.sharding.collective_timeout_s > 0 ? fmt::format("{:g} s", cfg.sharding.collective_timeout_s) : "off",
                 cpu_threads(), cpu_affinity().list);
  }
  if (!cfg.data.val.resolved.empty()) {
    val_full_ = std::make_unique<EvalSplit>(cfg.data.val.resolved, T_, rank_, world_, cfg.model.vocab_size);
    if (cfg.training.eval_tokens > 0)
      val_periodic_ = std::make_unique<EvalSplit>(cfg.data.val.resolved, T_, rank_, world_,
                                                  cfg.model.vocab_size, cfg.training.eval_tokens);
  }
}

void Trainer::evaluate_only() {
  const double loss = evaluate(engine_, *val_full_, B_, T_);
  if (lead_)
    spdlog::info("validation loss {:.6f} over {} sequences of {} tokens ({})", loss, val_full_->num_sequences(), T_,
                 cfg_.data.val.resolved);
}

std::vector<MicroBatch> Trainer::next_batches() {
  std::vector<int32_t> in(static_cast<size_t>(B_) * T_), tgt(static_cast<size_t>(B_) * T_);
  std::vector<MicroBatch> micro;
  for (int k = 0; k < A_; ++k) {
    loader_.next(in.data(), tgt.data());
    micro.push_back({tokens_tensor(in, {B_, T_}), tokens_tensor(tgt, {B_, T_})});
  }
  return micro;
}

// ----------------------------------------------------------------------------------------------
// The loop.
// ----------------------------------------------------------------------------------------------
void Trainer::train() {
  if (lead_) remove_stale_temporaries(cfg_.logging.run_dir.resolved, ckpt_root_);
  log_.open(cfg_.to_json(), resumed_.has_value());
  start_step_ = resumed_ ? resumed_->step : 0;
  tokens_seen_ = start_tokens_ = resumed_ ? resumed_->tokens : 0;  // tokens/s and MFU count this process's steps
  last_saved_ = resumed_ ? resumed_->step : -1;
  comm_.reset_counters();
  MemoryTracker::instance().reset_peaks();
  t_train_ = now_seconds();
  window_.restart(t_train_);
  int preempted = 0;  // the signal that stops the run
  for (int64_t step = start_step_; step < cfg_.training.steps; ++step) {
    set_comm_context("step " + std::to_string(step + 1));
    std::vector<MicroBatch> micro = next_batches();
    StepStats s;
    trace_.before_step(step + 1);
    try {
      s = engine_.train_step(micro, step);
    } catch (const NonFiniteLossError& e) {
      throw std::runtime_error(std::string(e.what()) + "; stopping without export. Lower optimizer.muon.lr / "
                               "optimizer.adamw.lr, enable training.grad_clip, or check model.init_from.");
    }
    trace_.after_step(step + 1);
    ++steps_done_;
    tokens_seen_ += s.tokens;
    final_train_loss_ = s.loss;
    opt_seconds_.push_back(s.seconds.optimizer);
    const double step_phases[4] = {s.seconds.forward, s.seconds.backward, s.seconds.reduce, s.seconds.optimizer};
    for (int i = 0; i < 4; ++i) phase_[i] += step_phases[i];
    window_.add(s);
    const bool last = step + 1 == cfg_.training.steps;
    if ((step + 1) % cfg_.logging.interval == 0 || last) log_progress(step, s);
    const bool stop = maybe_evaluate(step, last);
    if (stop && window_.steps > 0) log_progress(step, s);  // do not lose the last partial window
    preempted = any_rank_preempted();
    if (cfg_.checkpoint.interval > 0 && (step + 1) % cfg_.checkpoint.interval == 0) save(step + 1);
    if (preempted) {
      if (lead_) spdlog::warn("{} received: stopping after step {}", signal_name(preempted), step + 1);
      break;
    }
    if (stop) break;
  }
  trace_.finish();
  finish(preempted != 0);
}

// Periodic validation; true when it met training.target_val_loss (the run stops).
bool Trainer::maybe_evaluate(int64_t step, bool last) {
  const EvalSplit* periodic = val_periodic_ ? val_periodic_.get() : val_full_.get();
  if (!periodic || last || cfg_.training.eval_interval <= 0 || (step + 1) % cfg_.training.eval_interval != 0)
    return false;
  double v = run_eval(step + 1, *periodic);
  const auto& target = cfg_.training.target_val_loss;
  if (!target || v > *target) return false;
  if (periodic != val_full_.get()) {
    v = run_eval(step + 1, *val_full_);  // a partial estimate met the target: confirm on the whole split
    if (v > *target) return false;
  }
  time_to_target_ = now_seconds() - opts_.program_start;
  reached_target_ = true;
  last_val_ = v;
  if (lead_) spdlog::info("target validation loss {:.4f} reached at step {}: stopping", *target, step + 1);
  return true;
}

// A preemption signal on any rank stops every rank at this step boundary (one scalar collective).
// Returns the largest signal number that arrived on some rank, 0 when none did.
int Trainer::any_rank_preempted() {
  double any = comm_.all_reduce_scalar(stop_signal(), ReduceOp::max, CommPhase::other);
  if (opts_.replicas) any = opts_.replicas->all_reduce_scalar(any, ReduceOp::max, CommPhase::other);
  return static_cast<int>(any);
}

// The other ranks of `group` wait here while its rank 0 works on `bytes` alone (`what` says which
// and names the bytes): a wait for I/O, bounded by lead_io_timeout_seconds, not by the collective
// timeout, which is back after.
void Trainer::wait_for_lead_io(Communicator& group, int64_t bytes, const std::string& what) {
  const double collective = cfg_.sharding.collective_timeout_s;
  group.set_timeout(lead_io_timeout_seconds(bytes, collective), lead_io_timeout_name(what));
  group.barrier();
  group.set_timeout(collective, kCollectiveTimeoutKey);
}

// Validation; its time is kept out of tokens/s, MFU and train_seconds. best_val_loss only counts
// whole-split evaluations (a partial one is a noisier estimate).
double Trainer::run_eval(int64_t step, const EvalSplit& split) {
  const double t0 = now_seconds();
  const bool full = &split == val_full_.get();
  const double v = evaluate(engine_, split, B_, T_);
  if (full && (!std::isfinite(best_val_) || v < best_val_)) best_val_ = v;
  const double dt = now_seconds() - t0;
  eval_seconds_ += dt;
  window_.t_start += dt;
  if (lead_) {
    spdlog::info("step {:>6} | {} val loss {:.4f} ({} sequences, {:.1f}s)", step, full ? "full" : "partial", v,
                 split.num_sequences(), dt);
    log_.record({{"type", "eval"}, {"step", step}, {"split", full ? "full" : "partial"}, {"val_loss", v},
                 {"sequences", split.num_sequences()}, {"elapsed_seconds", now_seconds() - opts_.program_start}});
  }
  return v;
}

// Each element of `mine` summed over the ranks of `group`, in rank order (host gather: a few
// integers per rank).
std::vector<int64_t> sum_over(Communicator& group, const std::vector<int64_t>& mine) {
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(group.world_size())), sum(mine.size(), 0);
  group.all_gather_host(mine.data(), all.data(), static_cast<int64_t>(mine.size() * sizeof(int64_t)), CommPhase::other);
  for (size_t i = 0; i < all.size(); ++i) sum[i % mine.size()] += all[i];
  return sum;
}

// The experts' load since the last record over every rank (replicas included); null for dense
// models. Every rank has the same model, so either every rank takes part in the gathers or none.
nlohmann::json Trainer::global_expert_load() {
  std::vector<std::vector<int64_t>> counts = model_->take_expert_counts();
  if (counts.empty()) return nullptr;
  std::vector<int64_t> flat;
  for (const auto& layer : counts) flat.insert(flat.end(), layer.begin(), layer.end());
  flat = sum_over(comm_, flat);
  if (opts_.replicas) flat = sum_over(*opts_.replicas, flat);
  for (size_t l = 0, i = 0; l < counts.size(); ++l)
    for (int64_t& c : counts[l]) c = flat[i++];
  return expert_load_json(counts);
}

// One progress line and metrics record for the steps since the last one.
void Trainer::log_progress(int64_t step, const StepStats& s) {
  const nlohmann::json expert_load = global_expert_load();  // a collective for MoE models
  const double now = now_seconds(), dt = now - window_.t_start;
  const double tok_s = window_.tokens / std::max(dt, 1e-9);
  const double mfu = model_flops_utilization(model_->flops_per_token(), tok_s, precision_.peak_tflops_total);
  const double avg_step = (now - t_train_) / steps_done_;
  const double loss = window_.loss_sum / window_.steps;
  if (lead_) {
    spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.2e}/{:.2e} | grad norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
                 "fwd {:.0f} bwd {:.0f} reduce {:.0f} opt {:.0f} ms | ETA {}",
                 step + 1, cfg_.training.steps, loss, s.lr_muon, s.lr_adamw, s.grad_norm, tok_s, 100 * mfu,
                 1e3 * s.seconds.forward, 1e3 * s.seconds.backward, 1e3 * s.seconds.reduce, 1e3 * s.seconds.optimizer,
                 human_seconds(avg_step * (cfg_.training.steps - step - 1)));
    log_.record({{"type", "train"}, {"step", step + 1}, {"loss", loss}, {"lr_muon", s.lr_muon},
                 {"lr_adamw", s.lr_adamw}, {"grad_norm", s.grad_norm}, {"clip_coef", s.clip_coef},
                 {"tokens_per_second", tok_s}, {"mfu", mfu}, {"tokens", tokens_seen_},
                 {"max_attention_logit", cfg_.optim.qk_clip > 0 ? json(s.max_attention_logit) : json(nullptr)},
                 {"qk_clipped_heads", s.qk_clipped_heads}, {"expert_load", expert_load},
                 {"seconds", {{"forward", s.seconds.forward}, {"backward", s.seconds.backward}, {"reduce", s.seconds.reduce},
                              {"optimizer", s.seconds.optimizer}, {"step", s.seconds.total}}},
                 {"elapsed_seconds", now - opts_.program_start},
                 {"rank0", local_counters(comm_, engine_.device())},
                 {"rank0_step", {{"orthogonalizations", s.orthogonalizations},
                                 {"optimizer_step_bytes", s.optimizer_step_bytes},
                                 {"host_device_bytes", s.host_device_bytes},
                                 {"overlapped_reductions", s.overlapped_reductions}}}});
  }
  window_.restart(now);
}

void Trainer::save(int64_t step) {
  if (ckpt_root_.empty()) return;
  // HSDP replicas hold identical state: replica 0's shard group writes the checkpoint while the
  // other replicas wait for it (a wait behind I/O).
  if (!opts_.replicas || opts_.replicas->rank() == 0) {
    CheckpointMeta meta{step, tokens_seen_, loader_.state(), cfg_.to_json(), engine_.state_fingerprint(), data_files_};
    save_run_checkpoint(cfg_, ckpt_root_, engine_, meta, log_);
  }
  if (opts_.replicas) {
    const int64_t bytes = checkpoint_bytes_bound(engine_);
    wait_for_lead_io(*opts_.replicas, bytes, "replica 0's checkpoint, at most " + format_bytes(static_cast<double>(bytes)) + " written");
  }
  last_saved_ = step;
}

// ----------------------------------------------------------------------------------------------
// The end of a run: checkpoint, final validation, sample, export, summary.
// ----------------------------------------------------------------------------------------------
void Trainer::finish(bool preempted) {
  const int64_t final_step = start_step_ + steps_done_;
  if ((cfg_.checkpoint.at_end || preempted) && last_saved_ != final_step) save(final_step);
  if (preempted)
    throw Preempted("preempted after step " + std::to_string(final_step) +
                    (ckpt_root_.empty() ? " (no checkpoint: set checkpoint.dir or logging.run_dir)"
                                        : "; checkpoint saved, resume with --set training.resume=auto"));
  const double train_seconds = now_seconds() - t_train_ - eval_seconds_;
  // Training traffic and memory, before the final evaluation, sampling and export gather the model.
  const CommCounters counters = comm_.counters();
  const Device dev = engine_.device();
  std::vector<double> peaks;
  for (int c = 0; c < static_cast<int>(MemCategory::count); ++c)
    peaks.push_back(static_cast<double>(MemoryTracker::instance().peak(dev, static_cast<MemCategory>(c))));
  const double peak_total = static_cast<double>(MemoryTracker::instance().peak_total(dev));

  if (val_full_ && !reached_target_) {  // when the target stopped the run, its confirming evaluation counts
    last_val_ = run_eval(final_step, *val_full_);
    if (cfg_.training.target_val_loss && last_val_ <= *cfg_.training.target_val_loss)
      time_to_target_ = now_seconds() - opts_.program_start;
  }
  if (cfg_.training.sample_tokens > 0) {
    print_sample();
    wait_for_lead_io(comm_, 0, "rank 0's printing of the sample");  // decoding and one line: the bound's floor
  }
  if (!cfg_.output.export_path.resolved.empty()) export_model(final_step);
  write_summary(train_seconds, counters, peaks, peak_total);
}

// Every rank samples the same tokens from a forward that gathers one unit at a time (ZeRO-3
// memory); rank 0 prints them. A sample is a courtesy, so a failure is a warning, never a lost run.
void Trainer::print_sample() {
  // Prompt: the first quarter-context of the validation split (a real opening line), else one token.
  std::vector<int32_t> prompt;
  if (val_full_) {
    std::vector<int32_t> seq_in(T_), seq_tgt(T_);
    val_full_->sequence(0, seq_in.data(), seq_tgt.data());
    prompt.assign(seq_in.begin(), seq_in.begin() + std::max(1, T_ / 4));
  } else {
    prompt = {model_->start_token()};
  }
  std::vector<int32_t> ids;
  try {  // the same shapes on every rank, so a failure is every rank's
    ids = sample_from_logits([&](const Tensor& t) { return engine_.logits_by_unit(t); }, T_,
                             static_cast<int>(cfg_.model.vocab_size), prompt,
                             static_cast<int>(cfg_.training.sample_tokens), 0.8f, 0,
                             static_cast<uint64_t>(cfg_.training.seed));
  } catch (const std::exception& e) {
    if (lead_) spdlog::warn("[warning] sampling failed: {}", e.what());
    return;
  }
  if (!lead_) return;
  try {
    std::unique_ptr<Tokenizer> tok;
    if (!cfg_.data.tokenizer.empty()) tok = Tokenizer::load(cfg_.data.tokenizer, cfg_.data.tokenizer_path.resolved);
    auto render = [&](const std::vector<int32_t>& v) {
      if (tok) return tok->decode(v);
      std::string text;
      for (int32_t id : v) text += std::to_string(id) + " ";
      return text;
    };
    spdlog::info("---- sample: prompt [{}] + {} sampled tokens (temperature 0.8) ----\n{}{}\n----", render(prompt),
                 ids.size(), render(prompt), render(ids));
  } catch (const std::exception& e) {
    spdlog::warn("[warning] sampling failed: {}", e.what());
  }
  if (opts_.after_sample) opts_.after_sample();
}

// output.export: every rank gathers one unit at a time (ShardedEngine::ParameterStream, in
// inventory order, the order every export writes) and rank 0 writes each tensor as it arrives.
// When rank 0's write fails, it still takes part in the remaining gathers, then reports.
void Trainer::export_model(int64_t final_step) {
  const std::vector<ParamSpec>& params = units_.inventory().params;
  const int64_t bytes = model_->num_params() * 4;
  const std::string what = "rank 0's export, " + format_bytes(static_cast<double>(bytes)) + " written";
  // the gathers wait behind rank 0's writes: under the I/O bound of the whole export
  comm_.set_timeout(lead_io_timeout_seconds(bytes, cfg_.sharding.collective_timeout_s), lead_io_timeout_name(what));
  ShardedEngine::ParameterStream stream(engine_);
  size_t asked = 0;
  std::string failure;
  if (lead_) {
    std::filesystem::path out(cfg_.output.export_path.resolved);
    try {
      // the start-up rule again: another job may have started in that directory since
      if (const std::string e = export_output_problem(cfg_); !e.empty()) throw std::runtime_error(e);
      if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
      model_->export_weights(out.string(), ParamSource([&](const ParamSpec& p) {
                               check_arg(asked < params.size() && params[asked].name == p.name, "export",
                                         "parameter '" + p.name + "' asked out of inventory order");
                               ++asked;
                               return stream(p);
                             }),
                             {{"step", std::to_string(final_step)}, {"val_loss", std::to_string(last_val_)}});
      spdlog::info("exported the model to {} ({} layout, f32, streamed one unit at a time)", out.string(),
                   model_->export_layout());
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  for (; asked < params.size(); ++asked) stream.gather(params[asked]);  // the other ranks' gathers (and a failed lead's)
  comm_.set_timeout(cfg_.sharding.collective_timeout_s, kCollectiveTimeoutKey);
  if (!failure.empty()) throw std::runtime_error(failure);
  if (lead_ && opts_.after_export) opts_.after_export(cfg_.output.export_path.resolved);
  wait_for_lead_io(comm_, bytes, what);
}

// Collectives first (traffic summed, memory peaks maxed over ranks), then rank 0 writes.
void Trainer::write_summary(double train_seconds, const CommCounters& counters, const std::vector<double>& peaks,
                            double peak_total) {
  json comm_bytes, peak_bytes;
  for (int p = 0; p < static_cast<int>(CommPhase::count); ++p)
    comm_bytes[comm_phase_name(static_cast<CommPhase>(p))] = static_cast<int64_t>(
        comm_.all_reduce_scalar(static_cast<double>(counters.phase[p].bytes_sent), ReduceOp::sum, CommPhase::other));
  for (int c = 0; c < static_cast<int>(MemCategory::count); ++c)
    peak_bytes[mem_category_name(static_cast<MemCategory>(c))] =
        static_cast<int64_t>(comm_.all_reduce_scalar(peaks[c], ReduceOp::max, CommPhase::other));
  peak_bytes["total"] = static_cast<int64_t>(comm_.all_reduce_scalar(peak_total, ReduceOp::max, CommPhase::other));
  json planned;  // the memory plan beside the measured peaks, each term maxed over ranks as they are
  for (const auto& [term, bytes] : memory_plan_.terms())
    planned[term] = static_cast<int64_t>(comm_.all_reduce_scalar(bytes, ReduceOp::max, CommPhase::other));
  planned["persistent"] = static_cast<int64_t>(comm_.all_reduce_scalar(memory_plan_.persistent(), ReduceOp::max, CommPhase::other));
  planned["total"] = static_cast<int64_t>(comm_.all_reduce_scalar(memory_plan_.total(), ReduceOp::max, CommPhase::other));
  const std::string fingerprint = engine_.state_fingerprint();  // collective
  if (!lead_) return;
  const double wall = now_seconds() - opts_.program_start;
  const double tok_s = (tokens_seen_ - start_tokens_) / std::max(train_seconds, 1e-9);
  const int64_t final_step = start_step_ + steps_done_;
  log_.write_summary({
      {"world_size", world_},
      {"replicas", world_ / comm_.world_size()},
      {"nodes", std::max(opts_.topology.nodes(), 1)},
      {"ranks_per_node", opts_.topology.nodes() ? json(opts_.topology.ranks_per_node()) : json::array({world_})},
      {"node_names", opts_.topology.node_names},
      {"placement", placement_name(plan_.placement)},
      {"backend", comm_.backend_name()},
      {"steps", final_step},
      {"resumed_from_step", resumed_ ? json(resumed_->step) : json(nullptr)},
      {"tokens", tokens_seen_},
      {"wall_seconds", wall},
      {"train_seconds", train_seconds},
      {"eval_seconds", eval_seconds_},
      {"tokens_per_second", tok_s},
      {"mfu", model_flops_utilization(model_->flops_per_token(), tok_s, precision_.peak_tflops_total)},
      {"final_train_loss", nullable(final_train_loss_)},
      {"final_val_loss", nullable(last_val_)},
      {"best_val_loss", nullable(best_val_)},
      {"target_val_loss", cfg_.training.target_val_loss ? json(*cfg_.training.target_val_loss) : json(nullptr)},
      {"time_to_target_seconds", nullable(time_to_target_)},
      {"optimizer_step_seconds_median", median(opt_seconds_)},
      {"phase_seconds", {{"forward", phase_[0]}, {"backward", phase_[1]}, {"reduce", phase_[2]}, {"optimizer", phase_[3]}}},
      {"comm_bytes", comm_bytes},
      {"peak_bytes", peak_bytes},
      {"memory_plan_bytes", planned},
      {"parameters", model_->num_params()},
      {"state_fingerprint", fingerprint},
      {"config", cfg_.to_json()},
  });
  // Without data.val there is no validation loss to print (summary.json has null for both).
  const std::string val_text = val_full_ ? fmt::format("final val loss {:.4f} | best val {:.4f}", last_val_, best_val_)
                                         : std::string("no validation split (data.val is empty)");
  spdlog::info("done: {} steps, {} tokens in {} ({:.0f} tok/s) | final train loss {:.4f} | {} | "
               "opt-step bytes {} | peak memory/rank {} | state fingerprint {}",
               steps_done_, tokens_seen_ - start_tokens_, human_seconds(wall), tok_s, final_train_loss_, val_text,
               format_bytes(comm_bytes["opt_step"].get<double>()), format_bytes(peak_bytes["total"].get<double>()),
               fingerprint);
  if (!log_.dir().empty()) spdlog::info("run directory: {}", log_.dir().string());
}

}  // namespace

void run_training(const TrainConfig& asked, Communicator& comm, const TrainerOptions& opts) {
  arm_notice_signal(notice_signal_number(asked.checkpoint.notice_signal));
  if (opts.eval_only) end_on_stop_request("--eval-only has nothing to save");
  TrainConfig cfg = asked;  // auto precisions resolved, the same on every rank
  const RunPrecision precision = resolve_precision(cfg, comm, opts.replicas);
  Trainer trainer(cfg, comm, opts, precision);
  if (opts.eval_only) trainer.evaluate_only();
  else trainer.train();
}

}  // namespace mfsdp
