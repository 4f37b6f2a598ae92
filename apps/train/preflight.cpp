#include "apps/train/preflight.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/train/model_io.h"
#include "apps/train/output_files.h"
#include "apps/train/run_log.h"
#include "runtime/core/file_checks.h"
#include "models/hf_checkpoint.h"
#include "checkpoint/checkpoint_lock.h"
#include "checkpoint/owner_checkpoint.h"
#include "runtime/core/json_limits.h"
#include "runtime/core/utf8.h"
#include "runtime/cuda/device_api.h"
#include "runtime/data/token_shards.h"
#include "runtime/data/tokenizer.h"
#include "runtime/trace/trace.h"

namespace mfsdp {
namespace {

using json = nlohmann::json;

// The lock file of another mfsdp-train job's run directory or checkpoint directory that `file`
// would be written under (that directory or one below it), or "". This job's own directories are
// skipped; a lock is another job's when no shared lock on it can be taken now (the holder keeps an
// exclusive one until it exits).
std::string other_jobs_lock_above(const std::filesystem::path& file, const TrainConfig& cfg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto canonical = [&](const fs::path& p) { return p.empty() ? p : fs::weakly_canonical(p, ec); };
  const fs::path own_run = canonical(cfg.logging.run_dir.resolved);
  const fs::path own_ckpt = canonical(cfg.checkpoint.root(cfg.logging.run_dir.resolved));
  for (fs::path dir = canonical(fs::absolute(file, ec)).parent_path();; dir = dir.parent_path()) {
    if (dir != own_run && dir != own_ckpt)
      for (const char* name : {kRunDirLockFile, kCheckpointLockFile}) {
        const fs::path lock = dir / name;
        const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
        ::close(fd);  // and with it the shared lock, when taken
        if (held) return lock.string();
      }
    if (dir == dir.root_path() || dir.empty()) return "";
  }
}

// Why an output at `file` (named by config key `key`) must not be written because another job
// owns the directory it is in; "" when none does.
std::string inside_other_job(const std::filesystem::path& file, const TrainConfig& cfg, const std::string& key) {
  const std::string lock = other_jobs_lock_above(file, cfg);
  if (lock.empty()) return "";
  return cfg.source + ": " + key + ": " + file.string() + " is inside " +
         std::filesystem::path(lock).parent_path().string() + ", a directory of another mfsdp-train job that is running (it holds " +
         lock + "); choose a path outside it";
}

std::string check_writable_dir(const std::filesystem::path& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // A fresh temporary (never an existing file of the user's), removed again.
  if (!output_file_problem((dir / ".mfsdp_write_test").string()).empty())
    return what + ": cannot write into directory '" + dir.string() + "'";
  return "";
}

// Throws std::runtime_error "<key>: <what check() threw>".
void with_key(const std::string& key, const std::function<void()>& check) {
  try {
    check();
  } catch (const std::exception& e) {
    throw std::runtime_error(key + ": " + e.what());
  }
}

// Every file a data glob matches must have a UTF-8 name: checkpoint manifests and the start-up
// agreement record the names as JSON. "" when they do, else the first one (bad bytes as \xNN).
std::string non_utf8_name(const std::string& glob) {
  if (glob.empty()) return "";
  for (const std::string& f : expand_glob(glob))
    if (!is_valid_utf8(f)) return glob + " matches " + escape_invalid_utf8(f) + ", whose name is not valid UTF-8 (rename the file)";
  return "";
}

// The input files: shards, tokenizer, model.init_from.
std::string check_inputs(const TrainConfig& cfg, const TrainableModel& model, int64_t global_tokens) {
  with_key("data.train", [&] {
    validate_shards(cfg.data.train.resolved, cfg.model.vocab_size, global_tokens + 1,
                    "one global batch (world_size * grad_accum * micro_batch_size * seq_len + 1)");
  });
  if (!cfg.data.val.resolved.empty())
    with_key("data.val", [&] {
      validate_shards(cfg.data.val.resolved, cfg.model.vocab_size, cfg.model.seq_len + 1, "one sequence (seq_len + 1)");
    });
  for (const auto& [key, glob] : {std::pair{"data.train", cfg.data.train.resolved}, std::pair{"data.val", cfg.data.val.resolved}})
    if (std::string e = non_utf8_name(glob); !e.empty()) return cfg.source + ": " + key + ": " + e;
  if (!cfg.data.tokenizer.empty()) {
    std::unique_ptr<Tokenizer> tok;
    with_key("data.tokenizer_path", [&] { tok = Tokenizer::load(cfg.data.tokenizer, cfg.data.tokenizer_path.resolved); });
    if (tok->vocab_size() != cfg.model.vocab_size)  // samples are decoded with it
      return cfg.source + ": data.tokenizer_path: " + cfg.data.tokenizer_path.resolved + " has " +
             std::to_string(tok->vocab_size()) + " tokens but model.vocab_size is " + std::to_string(cfg.model.vocab_size);
  }
  if (cfg.model.init_from.resolved.empty()) return "";
  std::string bad;  // a NaN/Inf weight would only show up as a diverged step; one tensor in memory at a time
  with_key("model.init_from", [&] {
    const ParamReader read = model.open_weights(cfg.model.init_from.resolved);
    for (const ParamSpec& p : model.inventory().params) {
      const std::vector<float> values = read(p);
      for (size_t i = 0; i < values.size() && bad.empty(); ++i)
        if (!std::isfinite(values[i]))
          bad = "tensor '" + p.name + "' holds a non-finite value (" + std::to_string(values[i]) + " at element " +
                std::to_string(i) + ")";
      if (!bad.empty()) return;
    }
  });
  if (!bad.empty()) return cfg.source + ": model.init_from: " + cfg.model.init_from.resolved + ": " + bad;
  const std::string mismatch = model.init_from_mismatch(cfg.model.init_from.resolved);
  return mismatch.empty() ? "" : cfg.source + ": model.init_from: " + cfg.model.init_from.resolved + ": " + mismatch;
}

// training.resume and the checkpoint directory. Saving into a directory that holds other
// checkpoints is only safe when continuing from the newest of them: a fresh run, or one resumed
// from elsewhere or from an older step, would collide with them at save time and prune them.
// A step directory without a manifest (a save that did not finish) beyond the newest complete
// checkpoint: this run's save of that step would collide with it after all the training, so it is
// refused now. "" when there is none.
std::string incomplete_step_dirs_ahead(const TrainConfig& cfg, const std::string& ckpt_root,
                                       const std::vector<std::string>& complete) {
  namespace fs = std::filesystem;
  const auto step_of = [](const std::string& name) -> int64_t {  // step_NNNNNNNN, else -1
    if (name.size() != 13 || name.rfind("step_", 0) != 0) return -1;
    for (size_t i = 5; i < name.size(); ++i)
      if (name[i] < '0' || name[i] > '9') return -1;
    return std::stoll(name.substr(5));
  };
  const int64_t newest = complete.empty() ? 0 : step_of(fs::path(complete.back()).filename().string());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ckpt_root, ec)) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step > newest && entry.is_directory(ec) && !fs::exists(fs::symlink_status(entry.path() / "manifest.json", ec)))
      return cfg.source + ": checkpoint.dir: " + entry.path().string() +
             " has no manifest.json (a save that did not finish); this run would save step " + std::to_string(step) +
             " there after training: remove or move it (mfsdp-ckpt list " + ckpt_root + " shows the checkpoints)";
  }
  return "";
}

std::string check_checkpoints(const TrainConfig& cfg, bool eval_only) {
  const std::string ckpt_root = cfg.checkpoint.root(cfg.logging.run_dir.resolved);
  if (ckpt_root.empty() && (cfg.training.resume == "auto" || cfg.checkpoint.interval > 0))
    return cfg.source + ": " + (cfg.training.resume == "auto" ? "training.resume \"auto\"" : "checkpoint.interval") +
           " needs checkpoint.dir or logging.run_dir (where checkpoints live)";
  const std::string manifest = (std::filesystem::path(cfg.training.resume) / "manifest.json").string();
  if (!cfg.training.resume.empty() && cfg.training.resume != "auto" && !special_input_file(manifest).empty())
    return cfg.source + ": training.resume: " + special_input_file(manifest);  // a FIFO or a device, named
  if (!cfg.training.resume.empty() && cfg.training.resume != "auto" && !std::filesystem::is_regular_file(manifest))
    return cfg.source + ": training.resume: " + cfg.training.resume +
           " is not a complete checkpoint directory (no manifest.json)";
  if (eval_only || ckpt_root.empty() || !(cfg.checkpoint.interval > 0 || cfg.checkpoint.at_end)) return "";
  if (std::string e = check_writable_dir(ckpt_root, "checkpoint.dir"); !e.empty()) return cfg.source + ": " + e;
  const auto existing = list_checkpoints(ckpt_root);
  std::error_code eq;
  if (!existing.empty() && cfg.training.resume != "auto" &&
      (cfg.training.resume.empty() || !std::filesystem::equivalent(cfg.training.resume, existing.back(), eq)))
    return cfg.source + ": checkpoint.dir: " + ckpt_root + " already holds checkpoints (newest " +
           std::filesystem::path(existing.back()).filename().string() + ") that this run" +
           (cfg.training.resume.empty() ? "" : " (resumed from " + cfg.training.resume + ")") +
           " would overwrite or prune; continue the newest with --set training.resume=auto, or branch into "
           "another checkpoint.dir / logging.run_dir";
  return incomplete_step_dirs_ahead(cfg, ckpt_root, existing);
}

/// Every file the run reads or writes, as (its config key or "the config file", path), except those
/// of the key `except` (the output being checked against the others).
std::vector<std::pair<std::string, std::string>> files_of_the_run(const TrainConfig& cfg, const std::string& except) {
  std::vector<std::pair<std::string, std::string>> files = {{"the config file", cfg.source},
                                                            {"data.tokenizer_path", cfg.data.tokenizer_path.resolved},
                                                            {"model.init_from", cfg.model.init_from.resolved},
                                                            {"output.export", cfg.output.export_path.resolved},
                                                            {"logging.trace", cfg.logging.trace.resolved}};
  for (const auto& f : expand_glob(cfg.data.train.resolved)) files.push_back({"data.train", f});
  if (!cfg.data.val.resolved.empty())
    for (const auto& f : expand_glob(cfg.data.val.resolved)) files.push_back({"data.val", f});
  if (!cfg.logging.run_dir.resolved.empty())
    for (const char* f : kRunDirFiles)
      files.push_back({"logging.run_dir", (std::filesystem::path(cfg.logging.run_dir.resolved) / f).string()});
  std::erase_if(files, [&](const auto& f) { return f.first == except || f.second.empty(); });
  return files;
}

// output.export: a path ending in .safetensors is one file; anything else an export directory
// (model.safetensors + config.json, Hugging Face's from_pretrained layout). It must be writable,
// never a file the run reads or writes otherwise, and replace only an earlier export of ours.
std::string check_export_paths(const TrainConfig& cfg) {
  const HfExportPaths files = hf_export_paths(cfg.output.export_path.resolved);
  const std::filesystem::path out(cfg.output.export_path.resolved);
  const std::filesystem::path weights(files.weights);
  const std::vector<std::pair<std::string, std::string>> taken = files_of_the_run(cfg, "output.export");
  const auto same = [](const std::string& a, const std::string& b) {
    std::error_code ec;
    return !b.empty() && std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
  };
  const auto inside = [](const std::filesystem::path& p, const std::string& dir) {
    if (dir.empty()) return false;
    std::error_code ec;
    const auto rel = std::filesystem::weakly_canonical(p, ec).lexically_relative(std::filesystem::weakly_canonical(dir, ec));
    return !rel.empty() && *rel.begin() != "..";
  };
  const std::string ckpt_root = cfg.checkpoint.root(cfg.logging.run_dir.resolved);
  const std::string init_dir = std::filesystem::is_directory(cfg.model.init_from.resolved) ? cfg.model.init_from.resolved : "";
  for (const std::string& file : {out.string(), files.weights, files.config}) {
    if (file.empty()) continue;
    for (const auto& [what, dir] : {std::pair<std::string, std::string>{"checkpoint.dir", ckpt_root},
                                    {"training.resume", cfg.training.resume == "auto" ? "" : cfg.training.resume},
                                    {"model.init_from", init_dir}})
      if (inside(file, dir))
        return cfg.source + ": output.export: " + file + " is inside " + what + " (" + dir + "); choose a path outside it";
    for (const auto& [what, path] : taken)
      if (same(file, path))
        return cfg.source + ": output.export: " + file + " is " + what + " (" + path + "); choose another path";
  }
  if (files.config.empty() && std::filesystem::is_directory(out))
    return cfg.source + ": output.export: " + out.string() +
           " is a directory (a path ending in .safetensors names the exported file)";
  if (!files.config.empty() && std::filesystem::exists(out) && !std::filesystem::is_directory(out))
    return cfg.source + ": output.export: " + out.string() +
           " is a file (a path not ending in .safetensors names an export directory)";
  if (std::string e = foreign_export_files(out.string(), "output.export"); !e.empty())
    return cfg.source + ": output.export: " + e;
  std::string e = check_writable_dir(weights.has_parent_path() ? weights.parent_path() : ".", "output.export");
  return e.empty() ? "" : cfg.source + ": " + e;
}

// logging.trace: a writable file name (its directory is made) that is no file the run reads or
// writes otherwise, and no existing file but a trace of mfsdp-train.
std::string check_trace_path(const TrainConfig& cfg) {
  const std::filesystem::path out(cfg.logging.trace.resolved);
  if (std::string e = inside_other_job(out, cfg, "logging.trace"); !e.empty()) return e;
  std::error_code ec;
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path(), ec);
  if (std::string e = output_file_problem(out.string()); !e.empty()) return cfg.source + ": logging.trace: " + e;
  for (const auto& [what, path] : files_of_the_run(cfg, "logging.trace"))
    if (!path.empty() && std::filesystem::weakly_canonical(out, ec) == std::filesystem::weakly_canonical(path, ec))
      return cfg.source + ": logging.trace: " + out.string() + " is " + what + " (" + path + "); choose another path";
  const auto trace_ours = [](const std::filesystem::path& p) {  // a trace an earlier run wrote
    return read_input_file(p.string(), "", trace::kTraceFileHead.size(), false) == trace::kTraceFileHead;
  };
  const std::string e = foreign_outputs({{out, "a trace", trace_ours}}, "logging.trace");
  return e.empty() ? "" : cfg.source + ": logging.trace: " + e;
}

// The run directory: writable, and every file the run writes there absent or the trainer's own.
std::string check_run_dir(const TrainConfig& cfg) {
  if (cfg.logging.run_dir.resolved.empty()) return "";
  if (std::string e = check_writable_dir(cfg.logging.run_dir.resolved, "logging.run_dir"); !e.empty())
    return cfg.source + ": " + e;
  const std::string e = foreign_run_files(cfg.logging.run_dir.resolved, cfg.source);
  return e.empty() ? "" : cfg.source + ": logging.run_dir: " + e;
}

// runtime.device cuda needs a CUDA build and a visible GPU. Without them it is a config error,
// found on every rank before any communicator selects a device.
std::string check_device(const TrainConfig& cfg) {
  if (cfg.runtime.device != Device::CUDA) return "";
  const std::string what = cfg.source + ": runtime.device: cuda" +
                           (cfg.sharding.backend == CommBackend::nccl ? "" : std::string(" (sharding.backend ") +
                                                                              comm_backend_name(cfg.sharding.backend) + ")");
  if (!cuda::built())
    return what + ", but this build has no CUDA (configure with -DMFSDP_CUDA=ON), or set runtime.device cpu";
  if (cuda::device_count() == 0)
    return what + ", but this process sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES), or set "
                  "runtime.device cpu";
  return "";
}

}  // namespace

std::string trace_output_problem(const TrainConfig& cfg) {
  try {
    return check_trace_path(cfg);
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string export_output_problem(const TrainConfig& cfg) {
  try {
    for (const std::string& file : {cfg.output.export_path.resolved, hf_export_paths(cfg.output.export_path.resolved).config})
      if (!file.empty())
        if (std::string e = inside_other_job(file, cfg, "output.export"); !e.empty()) return e;
    return check_export_paths(cfg);
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string lock_run_dir(const TrainConfig& cfg) {
  std::filesystem::path dir = cfg.logging.run_dir.resolved;
  if (dir.empty()) dir = cfg.checkpoint.root("");
  if (dir.empty()) return "";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (dir / kRunDirLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return "";  // an unwritable run directory is reported by preflight_check
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return cfg.source + ": logging.run_dir: " + dir.string() +
           " is in use by another mfsdp-train job (it holds " + path + "); wait for it or use another run directory";
  }
  return "";  // the descriptor stays open, and the lock held, until the process exits
}

std::string preflight_check(const TrainConfig& cfg, int world_size, bool eval_only) {
  try {
    if (std::string e = check_device(cfg); !e.empty()) return e;
    if (eval_only && cfg.data.val.resolved.empty()) return cfg.source + ": --eval-only needs data.val (validation shards)";
    if (eval_only && cfg.model.init_from.resolved.empty())
      return cfg.source + ": --eval-only needs model.init_from (the model to evaluate)";
    const std::unique_ptr<TrainableModel> model = make_trainable_model(cfg);  // validates the architecture
    int64_t global_tokens = 0;
    if (__builtin_mul_overflow(static_cast<int64_t>(world_size) * cfg.training.grad_accum,
                               static_cast<int64_t>(cfg.training.micro_batch_size) * cfg.model.seq_len, &global_tokens) ||
        global_tokens > (int64_t(1) << 40))
      return cfg.source + ": world_size x training.grad_accum x training.micro_batch_size x model.seq_len is " +
             "larger than 2^40 tokens per step";
    if (std::string e = check_inputs(cfg, *model, global_tokens); !e.empty()) return e;
    if (std::string e = check_checkpoints(cfg, eval_only); !e.empty()) return e;
    if (eval_only) return "";
    // the outputs must be writable before hours of training, not after
    if (std::string e = check_run_dir(cfg); !e.empty()) return e;
    if (!cfg.logging.trace.resolved.empty())
      if (std::string e = trace_output_problem(cfg); !e.empty()) return e;
    if (!cfg.output.export_path.resolved.empty()) return export_output_problem(cfg);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace mfsdp
