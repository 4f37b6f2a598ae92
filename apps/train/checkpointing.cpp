#include "apps/train/checkpointing.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "apps/train/agreement.h"
#include "apps/train/model_io.h"
#include "apps/train/trainer.h"
#include "checkpoint/checkpoint_lock.h"
#include "planner/planner.h"
#include "runtime/core/clock.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/format_bytes.h"
#include "runtime/core/json_limits.h"

namespace mfsdp {

using json = nlohmann::json;

namespace {

void log_resumed(const TrainConfig& cfg, const CheckpointManifest& m, double seconds) {
  if (m.step >= cfg.training.steps)
    spdlog::warn("the checkpoint is at step {} and training.steps is {}: nothing left to train (raise training.steps "
                 "to continue)", m.step, cfg.training.steps);
  spdlog::info("resumed at step {} ({} tokens) from {} (saved by {} rank(s) under {}; loaded in {:.2f} s)", m.step,
               m.tokens, m.dir, m.world_size, m.placement, seconds);
  const json now = cfg.to_json();
  for (const auto& d : json::diff(m.config, now))
    if (d.value("op", "") == "replace")
      spdlog::info("  config change since the checkpoint: {}: {} -> {}", d["path"].get<std::string>(),
                   m.config.value(json::json_pointer(d["path"].get<std::string>()), json()).dump(), d["value"].dump());
}

// The files of data glob `glob` in expand_glob order, each with its content fingerprint.
json fingerprinted_files(const std::string& glob) {
  json out = json::array();
  if (!glob.empty())
    for (const std::string& f : expand_glob(glob)) out.push_back({{"file", f}, {"fingerprint", file_fingerprint(f)}});
  return out;
}

// One split of check_data_files: `saved` (the manifest's data.<split>) against `now`.
void check_data_split(const std::string& where, const std::string& key, const json& saved, const json& now) {
  const std::string restart = "; resuming would continue on other data. Restore the data the checkpoint was trained on, "
                              "or start a new run from its weights (mfsdp-ckpt export " + std::filesystem::path(where)
                              .parent_path().string() + " model.safetensors, then --set model.init_from=model.safetensors)";
  if (!saved.is_array()) throw CheckpointError(where + ": " + key + ": expected an array of {file, fingerprint}");
  if (saved.size() != now.size())
    throw CheckpointError(key + " names " + std::to_string(now.size()) + " file(s), but " + where + " records " +
                          std::to_string(saved.size()) + " for the run it checkpointed" + restart);
  for (size_t i = 0; i < saved.size(); ++i) {
    const std::string field = key + "[" + std::to_string(i) + "]";
    const json& s = saved[i];
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("fingerprint") ||
        !s["fingerprint"].is_string())
      throw CheckpointError(where + ": " + field + ": expected {\"file\": string, \"fingerprint\": string}");
    const std::string was = s["fingerprint"].get<std::string>(), is = now[i]["fingerprint"].get<std::string>();
    if (was != is)
      throw CheckpointError(now[i]["file"].get<std::string>() + " (" + key + ", file " + std::to_string(i + 1) + " of " +
                            std::to_string(now.size()) + ") is not the data the checkpoint was trained on: its content is " +
                            is + ", " + where + " records " + clip_for_message(was) + " for " +
                            clip_for_message(s["file"].get<std::string>()) + restart);
  }
}

}  // namespace

json data_fingerprints(const TrainConfig& cfg) {
  return {{"train", fingerprinted_files(cfg.data.train.resolved)}, {"val", fingerprinted_files(cfg.data.val.resolved)}};
}

std::string check_data_files(const CheckpointManifest& m, const TrainConfig& cfg) {
  const std::string where = (std::filesystem::path(m.dir) / "manifest.json").string();
  if (m.data.is_null())
    return where + " records no fingerprints of the data files (written by an older build): the data is not checked";
  const json now = data_fingerprints(cfg);
  check_data_split(where, "data.train", m.data.value("train", json()), now["train"]);
  const json saved_val = m.data.value("val", json::array());
  if (!now["val"].empty() && !(saved_val.is_array() && saved_val.empty()))  // adding or dropping val is allowed
    check_data_split(where, "data.val", saved_val, now["val"]);
  return "";
}

int64_t checkpoint_bytes_bound(const ShardedEngine& engine) {
  int64_t params = 0;
  for (const MatrixShard& s : engine.plan().shards) params += s.numel();
  return params * 12;
}

TrainConfig saved_config(const CheckpointManifest& m) {
  const std::string where = (std::filesystem::path(m.dir) / "manifest.json").string();
  try {
    return parse_train_config(m.config, where + " (config)", m.dir);
  } catch (const std::exception& e) {
    throw CheckpointError(where + ": config: " + e.what());
  }
}

void check_run_state(const CheckpointManifest& m, DataLoader& loader) {
  const std::string where = (std::filesystem::path(m.dir) / "manifest.json").string();
  const TrainConfig saved = saved_config(m);
  const int64_t replicas = std::max(1, saved.sharding.replicate);
  const int64_t expect = static_cast<int64_t>(m.world_size) * replicas * saved.training.grad_accum *
                         saved.training.micro_batch_size * saved.model.seq_len;
  if (m.loader.global_batch_tokens != expect)
    throw CheckpointError(where + ": loader.global_batch_tokens: " + std::to_string(m.loader.global_batch_tokens) +
                          " is not the saved run's global batch (" + std::to_string(m.world_size) + " ranks x " +
                          std::to_string(replicas) + " replicas x grad_accum " + std::to_string(saved.training.grad_accum) +
                          " x micro_batch_size " + std::to_string(saved.training.micro_batch_size) + " x seq_len " +
                          std::to_string(saved.model.seq_len) + " = " + std::to_string(expect) + " tokens)");
  try {
    loader.set_state(m.loader);  // the data position must fit this run's shards and batch
  } catch (const std::exception& e) {
    throw CheckpointError(where + ": loader (epoch " + std::to_string(m.loader.epoch) + ", shard " +
                          std::to_string(m.loader.shard) + ", batch " + std::to_string(m.loader.batch) + ", " +
                          std::to_string(m.loader.global_batch_tokens) + " tokens per step): " + e.what());
  }
}

std::vector<std::string> verify_run_state(const CheckpointManifest& m, const TrainConfig* run, std::string* note) {
  try {
    const TrainConfig saved = saved_config(m);
    const std::string data_note = check_data_files(m, run ? *run : saved);
    if (note) *note = data_note;
    const int world = m.world_size * std::max(1, saved.sharding.replicate);
    DataLoader loader(saved.data.train.resolved, saved.training.micro_batch_size, saved.model.seq_len, 0, world,
                      saved.training.grad_accum, saved.data.shuffle, static_cast<uint64_t>(saved.data.seed),
                      saved.model.vocab_size);
    check_run_state(m, loader);
  } catch (const CheckpointError& e) {
    return {e.what()};
  } catch (const std::exception& e) {  // the saved run's data could not be opened
    return {(std::filesystem::path(m.dir) / "manifest.json").string() + ": loader: cannot check the position against "
            "the saved run's data.train: " + e.what()};
  }
  return {};
}

std::string fingerprint_mismatch(ShardedEngine& engine, const CheckpointManifest& m) {
  const std::string fp = engine.state_fingerprint();
  if (fp == m.state_fingerprint) return "";
  return (std::filesystem::path(m.dir) / "manifest.json").string() + ": the loaded state has fingerprint " + fp +
         ", the manifest says " + clip_for_message(m.state_fingerprint) + " (edited or mismatched checkpoint)";
}

std::vector<std::string> verify_loaded_state(const CheckpointManifest& m, Communicator& comm) {
  try {
    const std::string where = (std::filesystem::path(m.dir) / "manifest.json").string();
    TrainConfig saved;
    try {  // the same model and optimizer on host buffers, without replicas
      saved = parse_train_config(m.config, where + " (config)", m.dir,
                                 {"sharding.backend=mpi", "runtime.device=cpu", "sharding.replicate=1"});
    } catch (const std::exception& e) {
      throw CheckpointError(where + ": config: " + e.what());
    }
    const std::unique_ptr<TrainableModel> model = make_trainable_model(saved);
    UnitModel& units = model->units();
    const ShardPlan plan = make_plan(units.inventory(), comm.world_size(), saved.sharding.placement,
                                     planner_options(saved.optim, units));
    ShardedEngine engine(units, comm, plan, saved.optim);
    load_checkpoint(engine, m);
    const std::string e = fingerprint_mismatch(engine, m);
    return e.empty() ? std::vector<std::string>{} : std::vector<std::string>{e};
  } catch (const std::exception& e) {
    return {e.what()};
  }
}

std::optional<CheckpointManifest> resume_run(const TrainConfig& cfg, const std::string& ckpt_root,
                                             ShardedEngine& engine, DataLoader& loader, bool lead) {
  std::optional<CheckpointManifest> resumed;
  std::string error, note, data_note;
  const double t_load = now_seconds();
  try {
    const std::string dir = resolve_resume(cfg.training.resume, ckpt_root, &note);
    if (!dir.empty()) {
      resumed = CheckpointManifest::read(dir);
      data_note = check_data_files(*resumed, cfg);  // the data it continues on is the data it was trained on
      load_checkpoint(engine, *resumed);
      check_run_state(*resumed, loader);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  // the first collective of the run
  if (engine.comm().all_reduce_scalar(error.empty() ? 0.0 : 1.0, ReduceOp::max, CommPhase::other) > 0)
    throw InputError(error.empty() ? "another rank could not load the checkpoint (see its message)" : error);
  // The loaded state must be the saved state: a hand-edited or mismatched manifest (step counter,
  // swapped moments) shows up here, on every rank alike.
  if (resumed)
    if (const std::string e = fingerprint_mismatch(engine, *resumed); !e.empty()) throw InputError(e);
  if (lead && !note.empty()) spdlog::info("{}", note);
  if (lead && !data_note.empty()) spdlog::warn("[notice] {}", data_note);
  if (lead && resumed) log_resumed(cfg, *resumed, now_seconds() - t_load);
  return resumed;
}

void save_run_checkpoint(const TrainConfig& cfg, const std::string& ckpt_root, ShardedEngine& engine,
                         const CheckpointMeta& meta, RunLog& log) {
  const double t0 = now_seconds();
  // The ranks wait behind file writes under the I/O bound of the checkpoint's size, not the collective timeout.
  const int64_t most = checkpoint_bytes_bound(engine);
  const double collective = cfg.sharding.collective_timeout_s;
  const SaveWaitBounds waits{lead_io_timeout_seconds(most, collective),
                             lead_io_timeout_name("the checkpoint's files, at most " + format_bytes(static_cast<double>(most)) +
                                                  " written by the ranks"),
                             collective, kCollectiveTimeoutKey};
  const std::string dir = save_checkpoint(engine, ckpt_root, meta, cfg.checkpoint.keep_last, &waits);
  if (!log.lead()) return;
  std::error_code ec;
  int64_t bytes = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) bytes += static_cast<int64_t>(f.file_size(ec));
  spdlog::info("step {:>6} | saved checkpoint {} ({}, {:.2f} s)", meta.step, dir, format_bytes(static_cast<double>(bytes)),
               now_seconds() - t0);
  log.record({{"type", "checkpoint"}, {"step", meta.step}, {"dir", dir}, {"bytes", bytes}, {"seconds", now_seconds() - t0}});
}

std::string lock_checkpoint_dir(const TrainConfig& cfg) {
  const std::string root = cfg.checkpoint.root(cfg.logging.run_dir.resolved);
  if (root.empty()) return "";
  const std::string e = lock_checkpoint_root(root, cfg.logging.run_dir.resolved);
  return e.empty() ? "" : cfg.source + ": checkpoint.dir: " + e;
}

void remove_stale_temporaries(const std::string& run_dir, const std::string& ckpt_root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> stale;
  // Only the SwapFile temporaries of the files this run writes there (is_temp_name_of).
  const auto collect = [&](const std::string& dir, std::initializer_list<const char*> targets) {
    if (dir.empty() || !fs::is_directory(dir, ec)) return;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      for (const char* t : targets)
        if (is_temp_name_of(name, t) && e.is_regular_file(ec)) stale.push_back(e.path());
    }
  };
  collect(run_dir, {"config.json", "summary.json"});
  collect(ckpt_root, {"latest"});
  if (!ckpt_root.empty() && fs::is_directory(ckpt_root, ec))
    for (const auto& e : fs::directory_iterator(ckpt_root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) != 0 || name.size() <= 9 || name.compare(name.size() - 4, 4, ".tmp") != 0) continue;
      if (const std::string foreign = foreign_partial_checkpoint(e.path().string()); foreign.empty())
        stale.push_back(e.path());
      else
        spdlog::warn("keeping {}: {}; not a partial checkpoint", e.path().string(), foreign);
    }
  for (const auto& p : stale) {
    fs::remove_all(p, ec);
    spdlog::info("removed {} (left by an interrupted write)", p.string());
  }
}

}  // namespace mfsdp
