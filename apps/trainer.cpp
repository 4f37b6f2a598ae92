#include "apps/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unistd.h>

#include "checkpoint/atomic_file.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/owner_checkpoint.h"
#include "models/gpt.h"
#include "planner/planner.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/token_shards.h"
#include "runtime/data/tokenizer.h"
#include "runtime/core/clock.h"
#include "runtime/core/json_limits.h"
#include "runtime/engine/sharded_engine.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

using json = nlohmann::json;

EngineOptions engine_options(const TrainConfig& cfg) {
  EngineOptions o;
  o.muon.momentum = cfg.muon.momentum;
  o.muon.nesterov = cfg.muon.nesterov;
  o.muon.ns_steps = cfg.muon.ns_steps;
  o.muon.weight_decay = cfg.muon.weight_decay;
  o.muon.scale_rule = parse_muon_scale_rule(cfg.muon.scale_rule);
  o.muon.split_qkv = cfg.muon.split_qkv;
  o.adamw.beta1 = cfg.adamw.beta1;
  o.adamw.beta2 = cfg.adamw.beta2;
  o.adamw.eps = cfg.adamw.eps;
  o.adamw.weight_decay = cfg.adamw.weight_decay;
  o.muon_lr = cfg.muon.lr;
  o.adamw_lr = cfg.adamw.lr;
  o.schedule.warmup_steps = cfg.schedule.warmup_steps;
  o.schedule.total_steps = cfg.training.steps;
  o.schedule.kind = parse_decay_kind(cfg.schedule.decay);
  o.schedule.floor = cfg.schedule.floor;
  o.schedule.decay_fraction = cfg.schedule.decay_fraction;
  o.grad_clip = cfg.training.grad_clip;
  return o;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, units[u]);
}

std::string human_seconds(double seconds) {
  const int64_t s = std::llround(std::max(0.0, seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
}

// Creates `dir` if needed and checks a file can be written there; "" when fine.
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

json nullable(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

// Leftovers of an interrupted write (ours: *.tmp next to files we write, step_N.tmp checkpoint
// directories) are removed at start, saying so; complete files are never touched.
void remove_stale_temporaries(const std::filesystem::path& run_dir, const std::string& ckpt_root) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  if (!run_dir.empty())
    for (const char* f : {"config.json.tmp", "summary.json.tmp"})
      if (std::filesystem::exists(run_dir / f, ec)) stale.push_back(run_dir / f);
  if (!ckpt_root.empty() && std::filesystem::is_directory(ckpt_root, ec)) {
    if (std::filesystem::exists(std::filesystem::path(ckpt_root) / "latest.tmp", ec))
      stale.push_back(std::filesystem::path(ckpt_root) / "latest.tmp");
    for (const auto& e : std::filesystem::directory_iterator(ckpt_root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0)
        stale.push_back(e.path());
    }
  }
  for (const auto& p : stale) {
    std::filesystem::remove_all(p, ec);
    spdlog::info("removed {} (left by an interrupted write)", p.string());
  }
}

// SIGTERM / SIGINT (what Slurm and Kubernetes send before killing): the first asks for a checkpoint
// at the next step boundary, a second one exits at once. The previous handlers come back after.
std::atomic<int> g_signal{0};
extern "C" void on_preemption_signal(int sig) {
  if (g_signal.exchange(sig) != 0) _exit(128 + sig);
}
class PreemptionGuard {
 public:
  PreemptionGuard() {
    g_signal = 0;
    old_term_ = std::signal(SIGTERM, on_preemption_signal);
    old_int_ = std::signal(SIGINT, on_preemption_signal);
  }
  ~PreemptionGuard() {
    std::signal(SIGTERM, old_term_);
    std::signal(SIGINT, old_int_);
  }
  bool requested() const { return g_signal.load() != 0; }

 private:
  void (*old_term_)(int) = SIG_DFL;
  void (*old_int_)(int) = SIG_DFL;
};

}  // namespace

void run_training(const TrainConfig& cfg, Communicator& comm, const TrainerOptions& opts) {
  const int rank = comm.rank(), W = comm.world_size();
  const bool lead = rank == 0;
  const GPTConfig gcfg = cfg.model.gpt();
  const int B = cfg.training.micro_batch_size, T = cfg.model.seq_len, A = cfg.training.grad_accum;

  GPT model(gcfg);
  ShardPlan plan = make_plan(model.inventory(), W, parse_placement(cfg.sharding.placement),
                             PlannerOptions{cfg.muon.ns_steps, cfg.muon.split_qkv, false});
  ShardedEngine engine(model, comm, plan, engine_options(cfg));
  if (!cfg.model.init_from.resolved.empty()) engine.load_full_parameters(import_hf_gpt2(cfg.model.init_from.resolved, gcfg));
  else engine.init_parameters(static_cast<uint64_t>(cfg.training.seed));

  DataLoader loader(cfg.data.train.resolved, B, T, rank, W, A, cfg.data.shuffle, static_cast<uint64_t>(cfg.data.seed),
                    cfg.model.vocab_size);

  // ---- resume: each rank reads the pieces it owns under this run's plan; all ranks agree ----
  const std::string ckpt_root = cfg.checkpoint.root(cfg.logging.run_dir.resolved);
  std::optional<CheckpointManifest> resumed;
  {
    std::string error, note;
    const double t_load = now_seconds();
    try {
      const std::string dir = resolve_resume(cfg.training.resume, ckpt_root, &note);
      if (!dir.empty()) {
        resumed = CheckpointManifest::read(dir);
        load_checkpoint(engine, *resumed);
        try {
          loader.set_state(resumed->loader);  // the data position must fit this run's shards and batch
        } catch (const std::exception& e) {
          throw CheckpointError(resumed->dir + "/manifest.json: loader: " + e.what());
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    // the first collective of the run
    if (comm.all_reduce_scalar(error.empty() ? 0.0 : 1.0, ReduceOp::max, CommPhase::other) > 0)
      throw InputError(error.empty() ? "another rank could not load the checkpoint (see its message)" : error);
    // The loaded state must be the saved state: a hand-edited or mismatched manifest (step counter,
    // swapped moments) shows up here, on every rank alike.
    if (resumed) {
      const std::string fp = engine.state_fingerprint();
      if (fp != resumed->state_fingerprint)
        throw InputError(resumed->dir + "/manifest.json: the loaded state has fingerprint " + fp + ", the manifest says " +
                         clip_for_message(resumed->state_fingerprint) + " (edited or mismatched checkpoint)");
    }
    if (lead && !note.empty()) spdlog::info("{}", note);
    if (resumed && lead && resumed->step >= cfg.training.steps)
      spdlog::warn("the checkpoint is at step {} and training.steps is {}: nothing left to train (raise training.steps "
                   "to continue)", resumed->step, cfg.training.steps);
    if (resumed && lead) {
      spdlog::info("resumed at step {} ({} tokens) from {} (saved by {} rank(s) under {}; loaded in {:.2f} s)",
                   resumed->step, resumed->tokens, resumed->dir, resumed->world_size, resumed->placement,
                   now_seconds() - t_load);
      const json now = cfg.to_json();
      for (const auto& d : json::diff(resumed->config, now))
        if (d.value("op", "") == "replace")
          spdlog::info("  config change since the checkpoint: {}: {} -> {}", d["path"].get<std::string>(),
                       resumed->config.value(json::json_pointer(d["path"].get<std::string>()), json()).dump(),
                       d["value"].dump());
    }
  }

  const auto& st = plan.stats;
  if (lead) {
    spdlog::info("MatrixFSDP | GPT {} layers, {} heads, width {}, context {}, vocab {} (padded {}), {:.2f}M parameters",
                 gcfg.n_layer, gcfg.n_head, gcfg.n_embd, T, gcfg.vocab_size, gcfg.padded_vocab_size(),
                 gcfg.num_params() / 1e6);
    spdlog::info("placement {} on {} rank(s) | Muon: {} matrices ({:.2f}M) | AdamW: {} tensors ({:.2f}M) | "
                 "optimizer FLOPs max/mean {:.2f}, bytes max/mean {:.2f}, empty segments {}",
                 placement_name(plan.placement), W, st.muon_params, st.muon_numel / 1e6, st.adamw_params,
                 st.adamw_numel / 1e6, st.flops_ratio(), st.bytes_ratio(), st.empty_segments);
    spdlog::info("the {} rank(s) agree on config, build and inputs (checked in {:.3f} s); collective timeout {}", W,
                 opts.agreement_seconds,
                 cfg.sharding.collective_timeout_s > 0 ? fmt::format("{:g} s", cfg.sharding.collective_timeout_s) : "off");
  }

  std::unique_ptr<EvalSplit> val_full, val_periodic;
  if (!cfg.data.val.resolved.empty()) {
    val_full = std::make_unique<EvalSplit>(cfg.data.val.resolved, T, rank, W, cfg.model.vocab_size);
    val_periodic = cfg.training.eval_tokens > 0
                       ? std::make_unique<EvalSplit>(cfg.data.val.resolved, T, rank, W, cfg.model.vocab_size,
                                                     cfg.training.eval_tokens)
                       : nullptr;
  }
  const EvalSplit* periodic = val_periodic ? val_periodic.get() : val_full.get();

  if (opts.eval_only) {
    const double loss = evaluate(engine, *val_full, B, T);
    if (lead) spdlog::info("validation loss {:.6f} over {} sequences of {} tokens ({})", loss,
                           val_full->num_sequences(), T, cfg.data.val.resolved);
    return;
  }

  // ---- run directory ----
  const std::filesystem::path run_dir = cfg.logging.run_dir.resolved.empty() ? "" : cfg.logging.run_dir.resolved;
  std::ofstream metrics;
  if (lead) remove_stale_temporaries(run_dir, ckpt_root);
  if (lead && !run_dir.empty()) {
    std::filesystem::create_directories(run_dir);
    std::filesystem::remove(run_dir / "summary.json");  // a summary only ever describes a finished run
    metrics.open(run_dir / "metrics.jsonl", resumed ? std::ios::app : std::ios::trunc);  // a resumed run continues it
    if (!metrics) throw std::runtime_error((run_dir / "metrics.jsonl").string() + ": cannot open for writing");
    write_file_atomic(run_dir / "config.json", cfg.to_json().dump(2) + "\n");
  }

  const double flops_per_token = gcfg.flops_per_token(T);
  const double peak = cfg.logging.peak_tflops * 1e12 * W;
  std::vector<int32_t> in(static_cast<size_t>(B) * T), tgt(static_cast<size_t>(B) * T);
  std::vector<double> opt_seconds;
  double phase[4] = {0, 0, 0, 0};  // forward, backward, reduce, optimizer (max over ranks per step)
  double final_train_loss = std::nan(""), best_val = std::nan(""), last_val = std::nan(""), time_to_target = std::nan("");
  const int64_t start_step = resumed ? resumed->step : 0;
  int64_t tokens_seen = resumed ? resumed->tokens : 0, steps_done = 0, last_saved = resumed ? resumed->step : -1;
  const int64_t start_tokens = tokens_seen;  // tokens/s and MFU count this process's steps only
  comm.reset_counters();
  MemoryTracker::instance().reset_peaks();
  const double t_train = now_seconds();
  double t_window = t_train, window_loss = 0, eval_seconds = 0;
  int64_t window_steps = 0, window_tokens = 0;

  auto log_json = [&](const json& j) {
    if (!metrics.is_open()) return;
    metrics << j.dump() << "\n" << std::flush;
    if (!metrics) throw std::runtime_error((run_dir / "metrics.jsonl").string() + ": write failed (disk full?)");
  };
  // Validation; its time is kept out of tokens/s, MFU and train_seconds. best_val_loss only counts
  // whole-split evaluations (a partial one is a noisier estimate).
  auto run_eval = [&](int64_t step, const EvalSplit& split) {
    const double t0 = now_seconds();
    const bool full = &split == val_full.get();
    const double v = evaluate(engine, split, B, T);
    if (full && (!std::isfinite(best_val) || v < best_val)) best_val = v;
    const double dt = now_seconds() - t0;
    eval_seconds += dt;
    t_window += dt;
    if (lead) {
      spdlog::info("step {:>6} | {} val loss {:.4f} ({} sequences, {:.1f}s)", step, full ? "full" : "partial", v,
                   split.num_sequences(), dt);
      log_json({{"type", "eval"}, {"step", step}, {"split", full ? "full" : "partial"}, {"val_loss", v},
                {"sequences", split.num_sequences()}, {"elapsed_seconds", now_seconds() - opts.program_start}});
    }
    return v;
  };

  // This rank's cumulative bytes sent per phase and peak bytes per memory category (no collective).
  auto rank0_counters = [&]() {
    json comm_sent, peaks;
    for (int p = 0; p < static_cast<int>(CommPhase::count); ++p)
      comm_sent[comm_phase_name(static_cast<CommPhase>(p))] = comm.counters().phase[p].bytes_sent;
    for (int c = 0; c < static_cast<int>(MemCategory::count); ++c)
      peaks[mem_category_name(static_cast<MemCategory>(c))] =
          MemoryTracker::instance().peak(Device::CPU, static_cast<MemCategory>(c));
    return json{{"comm_bytes_sent", comm_sent}, {"peak_bytes", peaks}};
  };
  // One progress line and metrics record for the steps since the last one.
  auto log_window = [&](int64_t step, const StepStats& s) {
    const double now = now_seconds(), dt = now - t_window;
    const double tok_s = window_tokens / std::max(dt, 1e-9);
    const double mfu = flops_per_token * tok_s / peak;
    const double avg_step = (now - t_train) / steps_done;
    if (lead) {
      spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.2e}/{:.2e} | grad norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
                   "fwd {:.0f} bwd {:.0f} reduce {:.0f} opt {:.0f} ms | ETA {}",
                   step + 1, cfg.training.steps, window_loss / window_steps, s.lr_muon, s.lr_adamw, s.grad_norm, tok_s,
                   100 * mfu, 1e3 * s.t_forward, 1e3 * s.t_backward, 1e3 * s.t_reduce, 1e3 * s.t_optimizer,
                   human_seconds(avg_step * (cfg.training.steps - step - 1)));
      log_json({{"type", "train"}, {"step", step + 1}, {"loss", window_loss / window_steps}, {"lr_muon", s.lr_muon},
                {"lr_adamw", s.lr_adamw}, {"grad_norm", s.grad_norm}, {"clip_coef", s.clip_coef},
                {"tokens_per_second", tok_s}, {"mfu", mfu}, {"tokens", tokens_seen},
                {"seconds", {{"forward", s.t_forward}, {"backward", s.t_backward}, {"reduce", s.t_reduce},
                             {"optimizer", s.t_optimizer}, {"step", s.t_total}}},
                {"elapsed_seconds", now - opts.program_start},
                {"rank0", rank0_counters()}});
    }
    t_window = now;
    window_loss = 0;
    window_steps = 0;
    window_tokens = 0;
  };
  // Checkpoints: collective; rank 0 reports where, how big and how long.
  auto save = [&](int64_t step) {
    const double t0 = now_seconds();
    CheckpointMeta meta{step, tokens_seen, loader.state(), cfg.to_json(), engine.state_fingerprint()};
    const std::string dir = save_checkpoint(engine, ckpt_root, meta, cfg.checkpoint.keep_last);
    last_saved = step;
    if (lead) {
      std::error_code ec;
      int64_t bytes = 0;
      for (const auto& f : std::filesystem::directory_iterator(dir, ec)) bytes += static_cast<int64_t>(f.file_size(ec));
      spdlog::info("step {:>6} | saved checkpoint {} ({}, {:.2f} s)", step, dir, human_bytes(static_cast<double>(bytes)),
                   now_seconds() - t0);
      log_json({{"type", "checkpoint"}, {"step", step}, {"dir", dir}, {"bytes", bytes}, {"seconds", now_seconds() - t0}});
    }
  };
  PreemptionGuard preemption;
  bool reached_target = false, preempted = false;
  // Test-only fault injection: rank 0 kills itself (SIGKILL) at the start of this step.
  const char* kill_env = std::getenv("MFSDP_TEST_KILL_AT_STEP");
  const int64_t kill_at = kill_env ? std::atoll(kill_env) : -1;
  for (int64_t step = start_step; step < cfg.training.steps; ++step) {
    if (step == kill_at && lead) std::raise(SIGKILL);
    set_comm_context("step " + std::to_string(step + 1));
    std::vector<MicroBatch> micro;
    for (int k = 0; k < A; ++k) {
      loader.next(in.data(), tgt.data());
      micro.push_back({tokens_tensor(in, {B, T}), tokens_tensor(tgt, {B, T})});
    }
    StepStats s;
    try {
      s = engine.train_step(micro, step);
    } catch (const NonFiniteLossError& e) {
      throw std::runtime_error(std::string(e.what()) + "; stopping without export. Lower optimizer.muon.lr / "
                               "optimizer.adamw.lr, enable training.grad_clip, or check model.init_from.");
    }
    const double t_phase[4] = {s.t_forward, s.t_backward, s.t_reduce, s.t_optimizer};
    for (int i = 0; i < 4; ++i) phase[i] += comm.all_reduce_scalar(t_phase[i], ReduceOp::max, CommPhase::other);
    opt_seconds.push_back(comm.all_reduce_scalar(s.t_optimizer, ReduceOp::max, CommPhase::other));
    ++steps_done;
    tokens_seen += s.tokens;
    final_train_loss = s.loss;
    window_loss += s.loss;
    ++window_steps;
    window_tokens += s.tokens;

    const bool last = step + 1 == cfg.training.steps;
    if ((step + 1) % cfg.logging.interval == 0 || last) log_window(step, s);
    const bool eval_now = periodic && !last && cfg.training.eval_interval > 0 && (step + 1) % cfg.training.eval_interval == 0;
    double v = std::nan("");
    if (eval_now) {
      v = run_eval(step + 1, *periodic);
      if (cfg.training.target_val_loss && v <= *cfg.training.target_val_loss && periodic != val_full.get())
        v = run_eval(step + 1, *val_full);  // a partial estimate met the target: confirm on the whole split
    }
    const bool stop = eval_now && cfg.training.target_val_loss && v <= *cfg.training.target_val_loss;
    if (stop && window_steps > 0) log_window(step, s);  // do not lose the last partial window
    // A SIGTERM/SIGINT on any rank stops every rank at this step boundary (one scalar collective).
    preempted = comm.all_reduce_scalar(preemption.requested() ? 1.0 : 0.0, ReduceOp::max, CommPhase::other) > 0;
    if (!ckpt_root.empty() && cfg.checkpoint.interval > 0 && (step + 1) % cfg.checkpoint.interval == 0) save(step + 1);
    if (preempted) {
      if (lead) spdlog::warn("preemption signal received: stopping after step {}", step + 1);
      break;
    }
    if (stop) {
      time_to_target = now_seconds() - opts.program_start;
      reached_target = true;
      last_val = v;
      if (lead) spdlog::info("target validation loss {:.4f} reached at step {}: stopping", *cfg.training.target_val_loss, step + 1);
      break;
    }
  }
  const int64_t final_step = start_step + steps_done;
  if (!ckpt_root.empty() && (cfg.checkpoint.at_end || preempted) && last_saved != final_step) save(final_step);
  if (preempted) throw Preempted("preempted after step " + std::to_string(final_step) +
                                 (ckpt_root.empty() ? " (no checkpoint: set checkpoint.dir or logging.run_dir)"
                                                    : "; checkpoint saved, resume with --set training.resume=auto"));
  const double train_seconds = now_seconds() - t_train - eval_seconds;
  // Training traffic and memory, before the final evaluation, sampling and export gather the model.
  const CommCounters train_counters = comm.counters();
  std::vector<double> train_peaks;
  for (int c = 0; c < static_cast<int>(MemCategory::count); ++c)
    train_peaks.push_back(static_cast<double>(MemoryTracker::instance().peak(Device::CPU, static_cast<MemCategory>(c))));
  const double train_peak_total = static_cast<double>(MemoryTracker::instance().peak_total(Device::CPU));

  // ---- final validation over the whole split ----
  double final_val = last_val;  // the confirming whole-split evaluation when the target stopped the run
  if (val_full && !reached_target) {
    final_val = run_eval(final_step, *val_full);
    if (!reached_target && cfg.training.target_val_loss && final_val <= *cfg.training.target_val_loss)
      time_to_target = now_seconds() - opts.program_start;
  }

  // ---- sample ----
  if (cfg.training.sample_tokens > 0) {
    engine.with_full_model([&] {
      if (!lead) return;
      try {
        std::unique_ptr<Tokenizer> tok;
        if (!cfg.data.tokenizer.empty()) tok = Tokenizer::load(cfg.data.tokenizer, cfg.data.tokenizer_path.resolved);
        // Prompt: the first quarter-context of the validation split (a real opening line), else one token.
        std::vector<int32_t> prompt;
        if (val_full) {
          std::vector<int32_t> seq_in(T), seq_tgt(T);
          val_full->sequence(0, seq_in.data(), seq_tgt.data());
          prompt.assign(seq_in.begin(), seq_in.begin() + std::max(1, T / 4));
        } else {
          prompt = {gcfg.vocab_size > 50256 ? 50256 : 0};  // GPT-2 <|endoftext|>
        }
        auto ids = sample_tokens(model, prompt, static_cast<int>(cfg.training.sample_tokens), 0.8f, 0,
                                 static_cast<uint64_t>(cfg.training.seed));
        auto render = [&](const std::vector<int32_t>& v) {
          if (tok) return tok->decode(v);
          std::string text;
          for (int32_t id : v) text += std::to_string(id) + " ";
          return text;
        };
        spdlog::info("---- sample: prompt [{}] + {} sampled tokens (temperature 0.8) ----\n{}{}\n----", render(prompt),
                     ids.size(), render(prompt), render(ids));
      } catch (const std::exception& e) {  // a sample is a courtesy: never lose the run over it
        spdlog::warn("[warning] sampling failed: {}", e.what());
      }
    });
  }

  // ---- export ----
  if (!cfg.output.export_path.resolved.empty()) {
    auto full = engine.full_parameters();
    if (lead) {
      std::filesystem::path out(cfg.output.export_path.resolved);
      if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
      export_hf_gpt2(out.string(), gcfg, full, DType::f32,
                     {{"step", std::to_string(final_step)}, {"val_loss", std::to_string(final_val)}});
      spdlog::info("exported the model to {} (Hugging Face GPT-2 layout, f32)", out.string());
    }
  }

  // ---- summary (collectives first, then rank 0 writes) ----
  json comm_bytes, peak_bytes;
  for (int p = 0; p < static_cast<int>(CommPhase::count); ++p) {
    const double sent = static_cast<double>(train_counters.phase[p].bytes_sent);
    comm_bytes[comm_phase_name(static_cast<CommPhase>(p))] =
        static_cast<int64_t>(comm.all_reduce_scalar(sent, ReduceOp::sum, CommPhase::other));
  }
  for (int c = 0; c < static_cast<int>(MemCategory::count); ++c)
    peak_bytes[mem_category_name(static_cast<MemCategory>(c))] =
        static_cast<int64_t>(comm.all_reduce_scalar(train_peaks[c], ReduceOp::max, CommPhase::other));
  peak_bytes["total"] = static_cast<int64_t>(comm.all_reduce_scalar(train_peak_total, ReduceOp::max, CommPhase::other));
  const std::string fingerprint = engine.state_fingerprint();  // collective
  if (!lead) return;
  const double wall = now_seconds() - opts.program_start;
  json summary = {
      {"world_size", W},
      {"placement", placement_name(plan.placement)},
      {"steps", final_step},
      {"resumed_from_step", resumed ? json(resumed->step) : json(nullptr)},
      {"tokens", tokens_seen},
      {"wall_seconds", wall},
      {"train_seconds", train_seconds},
      {"eval_seconds", eval_seconds},
      {"tokens_per_second", (tokens_seen - start_tokens) / std::max(train_seconds, 1e-9)},
      {"mfu", flops_per_token * (tokens_seen - start_tokens) / std::max(train_seconds, 1e-9) / peak},
      {"final_train_loss", nullable(final_train_loss)},
      {"final_val_loss", nullable(final_val)},
      {"best_val_loss", nullable(best_val)},
      {"target_val_loss", cfg.training.target_val_loss ? json(*cfg.training.target_val_loss) : json(nullptr)},
      {"time_to_target_seconds", nullable(time_to_target)},
      {"optimizer_step_seconds_median", median(opt_seconds)},
      {"phase_seconds", {{"forward", phase[0]}, {"backward", phase[1]}, {"reduce", phase[2]}, {"optimizer", phase[3]}}},
      {"comm_bytes", comm_bytes},
      {"peak_bytes", peak_bytes},
      {"parameters", gcfg.num_params()},
      {"state_fingerprint", fingerprint},
      {"config", cfg.to_json()},
  };
  if (!run_dir.empty()) {
    write_file_atomic(run_dir / "summary.json", summary.dump(2) + "\n");
  }
  spdlog::info("done: {} steps, {} tokens in {} ({:.0f} tok/s) | final train loss {:.4f} | final val loss {:.4f} | "
               "best val {:.4f} | opt-step bytes {} | peak memory/rank {} | state fingerprint {}",
               steps_done, tokens_seen - start_tokens, human_seconds(wall), (tokens_seen - start_tokens) / std::max(train_seconds, 1e-9),
               final_train_loss, final_val, best_val, human_bytes(comm_bytes["opt_step"].get<double>()),
               human_bytes(peak_bytes["total"].get<double>()), fingerprint);
  if (!run_dir.empty()) spdlog::info("run directory: {}", run_dir.string());
}

}  // namespace mfsdp
