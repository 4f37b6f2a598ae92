// The training configuration (mfsdp-train --config X.json [--set key.path=value ...]).
// Every field, its default and its range are documented in configs/README.md.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/comm_backend.h"
#include "models/gpt_spec.h"
#include "models/llama_spec.h"
#include "models/moe_spec.h"
#include "planner/shard_plan.h"
#include "runtime/engine/engine_options.h"
#include "runtime/engine/resolve.h"
#include "runtime/core/name_table.h"
#include "runtime/core/utf8.h"

namespace mfsdp {

/// A config problem. The message names the file (or the --set override) and the key path, e.g.
/// "configs/x.json: optimizer.muon.lr: expected a number, got \"fast\"". Apps exit with code 2.
/// Bytes of the message that are not UTF-8 (from a file name or a --set value) are shown as \xNN.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(escape_invalid_utf8(what)) {}
};

/// A path as written in the config (`raw`) and resolved (`resolved`): relative paths from the
/// config file are resolved against the file's directory, relative paths from --set overrides
/// and defaults against the current working directory; "" stays "".
struct ConfigPath {
  std::string raw;
  std::string resolved;
};

struct ModelSection {
  std::string arch = "gpt2";  ///< "gpt2", "llama" or "qwen2_moe"
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int seq_len = 64;
  int64_t vocab_size = 65;
  bool tie_embeddings = true;
  /// "" , a Hugging Face checkpoint directory (config.json + model.safetensors or sharded
  /// model-0000x-of-0000y.safetensors with model.safetensors.index.json) of model.arch, or one
  /// exported .safetensors file
  ConfigPath init_from;
  double init_std = 0.02;  ///< std of the normal init of matrices and embeddings
  // Llama and MoE only (model.arch "llama", "qwen2_moe"); after parsing they hold the resolved values.
  int n_kv_head = 0;             ///< key/value heads; 0 = n_head
  int intermediate_size = 0;     ///< SwiGLU width; 0 = 8/3 n_embd rounded up to a multiple of 256
  double norm_eps = 1e-5;        ///< RMSNorm epsilon
  double rope_theta = 10000.0;   ///< RoPE base
  // MoE only (model.arch "qwen2_moe"; models/moe_spec.h MoeConfig).
  int num_experts = 8;
  int num_experts_per_tok = 2;
  int moe_intermediate_size = 0;  ///< 0 = the resolved intermediate_size / num_experts_per_tok, rounded up
  int shared_expert_intermediate_size = 0;  ///< 0 = no shared expert
  bool norm_topk_prob = false;
  double router_aux_loss_coef = 0.001;
  double router_z_loss_coef = 0.0;
  std::string router_optimizer = "adamw";  ///< "adamw" (role router) or "muon" (role matrix)
  /// The model architecture as models/gpt_spec.h expects it (model.arch "gpt2").
  GPTConfig gpt() const;
  /// The model architecture as models/llama_spec.h expects it (model.arch "llama").
  LlamaConfig llama() const;
  /// The model architecture as models/moe_spec.h expects it (model.arch "qwen2_moe").
  MoeConfig moe() const;
  /// The parameter inventory of model.arch (validated; throws std::invalid_argument naming the field).
  ParamInventory inventory() const;
  /// What the engine's rules and the planner need of the model before it is built (as its
  /// UnitModel will report: GPT has attention heads of n_embd / n_head rows, Llama reports none;
  /// both have n_embd / n_head features per head).
  ModelFacts facts() const;
};

struct DataSection {
  ConfigPath train;            ///< shard glob, required
  ConfigPath val;              ///< shard glob, "" = no validation
  std::string tokenizer;       ///< "" (none: samples printed as ids), "char" or "gpt2"
  ConfigPath tokenizer_path;   ///< char meta JSON or GPT-2 tokenizer directory
  bool shuffle = true;
  int64_t seed = 1337;         ///< data order seed (>= 0)
};

/// runtime.device (kDeviceNames). runtime.attention is EngineOptions::attention (kAttentionNames).
struct RuntimeSection {
  /// Where every rank trains (CUDA: the GPU of its local rank on the node). When the config sets
  /// only sharding.backend, the backend's device (mpi: cpu, else cuda).
  Device device = Device::CPU;
};

/// sharding.memory_check: what start-up does when the per-rank memory plan does not fit
/// (apps/train/memory_check.h): refuse the run (exit 2), warn and go on, or skip the check.
enum class MemoryCheck { error, warn, off };
inline constexpr NameTable<MemoryCheck, 3> kMemoryCheckNames{
    {{{MemoryCheck::error, "error"}, {MemoryCheck::warn, "warn"}, {MemoryCheck::off, "off"}}}};

struct ShardingSection {
  Placement placement = Placement::matrixfsdp;
  MemoryCheck memory_check = MemoryCheck::error;
  /// the communicator backend, which moves buffers of runtime.device (mpi: CPU; cuda_staged and
  /// nccl: CUDA); when the config does not set it: mpi for cpu, nccl for cuda
  CommBackend backend = CommBackend::mpi;
  /// HSDP: R replicas of world / R shard ranks (1 = plain sharding over the whole world); owners
  /// are planned within a shard group and gradients chained through the replicas in rank order
  /// (planner/placement_traits.h). Not with ddp.
  int replicate = 1;
  bool debug_checks = false;
  /// NCCL: a blocking communicator whose every call waits for its communication (exact
  /// per-call seconds, errors reported by the call that caused them); for diagnostics. The
  /// default is non-blocking NCCL (CudaCommOptions::blocking, comm/comm_factory.h).
  bool nccl_blocking = false;
  int64_t reduce_chunk_bytes = 4 << 20;  ///< staging chunk of the gradient reduce-scatter
  /// a collective still waiting after this many seconds aborts the job naming rank, operation,
  /// phase, step and sizes; 0 = wait forever
  double collective_timeout_s = 600;
};

struct TrainingSection {
  int64_t steps = 1000;
  int micro_batch_size = 12;
  int grad_accum = 1;
  /// Sequences per optimizer step over every rank; when set, grad_accum is derived from it at the
  /// run's world size (apply_global_batch), so a job resumed on fewer nodes keeps its batch.
  std::optional<int64_t> global_batch_size;
  int64_t eval_interval = 250;  ///< steps between validations; 0 = only at the end
  int64_t eval_tokens = 0;      ///< tokens per periodic validation; 0 = whole split
  int64_t seed = 1337;          ///< parameter init seed
  std::optional<double> target_val_loss;  ///< stop when the validation loss reaches it
  int64_t sample_tokens = 200;  ///< tokens sampled at the end; 0 = none
  /// "" = start fresh, "auto" = the newest complete checkpoint in checkpoint.dir (else fresh),
  /// otherwise a checkpoint directory (which must be complete)
  std::string resume;
};

struct CheckpointSection {
  ConfigPath dir;          ///< "" = <logging.run_dir>/checkpoints
  int64_t interval = 0;    ///< steps between checkpoints; 0 = none
  int keep_last = 3;       ///< complete checkpoints kept (0 = all); older ones go after a newer one is complete
  bool at_end = true;      ///< save when training ends (also after a preemption signal)
  /// The scheduler's notice signal that, like SIGTERM and SIGINT, saves at the next step boundary
  /// and stops (apps/train/preemption.h lists the names)
  std::string notice_signal = "SIGUSR1";
  /// The checkpoint root this config resolves to ("" when neither dir nor run_dir is set).
  std::string root(const std::string& run_dir) const;
};

/// What the config asks for a compute precision (precision.matmul_dtype, optimizer.muon.ns_dtype):
/// param (matmuls only: as precision.param_dtype), auto (the faster of bf16 and f32 products by the
/// start-up GEMM probe on CPU ranks; bf16 on CUDA), f32 or bf16. Resolved at start-up into
/// EngineOptions (apps/train/run_precision.h).
enum class DTypeChoice { param, auto_, f32, bf16 };
/// "param", "auto", "f32", "bf16" (precision.matmul_dtype).
inline constexpr NameTable<DTypeChoice, 4> kMatmulChoiceNames{{{{DTypeChoice::param, "param"},
                                                                {DTypeChoice::auto_, "auto"},
                                                                {DTypeChoice::f32, "f32"},
                                                                {DTypeChoice::bf16, "bf16"}}}};
/// "auto", "f32", "bf16" (optimizer.muon.ns_dtype).
inline constexpr NameTable<DTypeChoice, 3> kNsChoiceNames{
    {{{DTypeChoice::auto_, "auto"}, {DTypeChoice::f32, "f32"}, {DTypeChoice::bf16, "bf16"}}}};

/// The precisions as asked; the resolved ones live in TrainConfig::optim.
struct PrecisionSection {
  DTypeChoice matmul = DTypeChoice::param;  ///< precision.matmul_dtype
  DTypeChoice ns = DTypeChoice::f32;        ///< optimizer.muon.ns_dtype
};

struct LoggingSection {
  int64_t interval = 10;
  /// Peak FLOP/s of one rank's device in TFLOP/s, the denominator of MFU. Unset (null): CPU ranks
  /// use their measured GEMM rate of the run's matmul dtype (runtime/gemm_probe.h), CUDA ranks
  /// kCudaPeakTflops (runtime/gemm_probe.h).
  std::optional<double> peak_tflops;
  ConfigPath run_dir{"runs/latest", ""};
  /// "" = off; else the Chrome-trace / Perfetto JSON file rank 0 writes with every rank's
  /// timeline of steps trace_start .. trace_start + trace_steps - 1 (1-based, as in the logs;
  /// the default skips the first, warm-up step)
  ConfigPath trace;
  int64_t trace_start = 2;
  int64_t trace_steps = 3;
};

struct OutputSection {
  ConfigPath export_path;  ///< JSON key "export": "" or the safetensors file to write at the end
};

/// The effective training configuration: defaults, then the file, then the overrides.
struct TrainConfig {
  ModelSection model;
  DataSection data;
  /// The engine's options, parsed straight into the library structs (their one representation):
  /// JSON "optimizer.muon" (-> muon, lr included; qk_clip and overlap_backward -> the engine's),
  /// "optimizer.adamw" (-> adamw), "schedule" (total_steps = training.steps), "training.grad_clip",
  /// "training.recompute" (-> recompute_units, kRecomputeNames), "runtime.attention" (->
  /// attention, kAttentionNames), "precision" (param_dtype, reduce_dtype) and
  /// "sharding.prefetch_depth" (-1 = unset), "prefetch_limit_bytes", "overlap_reduce" (kToggleNames),
  /// "expert_parallel".
  /// The parser checks them with resolve() (runtime/engine/resolve.h) for runtime.device,
  /// sharding.placement and sharding.replicate, and maps a rejected field back to its key.
  EngineOptions optim;
  PrecisionSection precision;
  RuntimeSection runtime;
  ShardingSection sharding;
  TrainingSection training;
  LoggingSection logging;
  OutputSection output;
  CheckpointSection checkpoint;
  std::string source;  ///< the config file it was loaded from ("" for defaults)

  /// The effective config as JSON (same keys as the file). resolved_paths = true writes the
  /// resolved paths (for manifests and --print-config), false the raw ones.
  nlohmann::json to_json(bool resolved_paths = true) const;
};

/// Loads `path`, applies `overrides` ("key.path=value"; value parsed as JSON, falling back to a
/// plain string when it is not valid JSON) and checks everything the config alone can tell:
/// unknown keys (with a did-you-mean), types, ranges and enumerations, the engine's rules
/// (resolve(), named by config key), n_embd % n_head, the
/// vocabulary against the shard formats, a missing train glob, and that every string (and every
/// resolved path) is valid UTF-8. Throws ConfigError naming the file or override and the key
/// path. Files (shards, tokenizer) are not opened. Defined in config_file.cpp.
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Parses one config input (a file's text, a --set value) as every config input is read: comments
/// allowed, at most kMaxJsonDepth levels (counted by the parser, so no comment or string hides one),
/// no key twice in one object, no NUL in a key or string, UTF-8. Text that is not JSON is the plain
/// string `text` when `plain_string_if_not_json` (--set a=hello), else an error. Throws ConfigError
/// "<where>: ...". Defined in config_file.cpp.
nlohmann::json parse_config_json(const std::string& text, const std::string& where, bool plain_string_if_not_json);

/// training.global_batch_size at `world_size` ranks: sets training.grad_accum to G / (world_size x
/// micro_batch_size) and returns ""; without the key, "". Otherwise why not: "<source>:
/// training.global_batch_size G is not divisible by world size W x training.micro_batch_size B (=
/// W*B); world sizes that divide it: ..." (at most 12 listed), naming both numbers.
std::string apply_global_batch(TrainConfig& cfg, int world_size);

/// The same from an in-memory JSON document (`source` names it in messages; relative paths are
/// resolved against `base_dir`).
TrainConfig parse_train_config(const nlohmann::json& doc, const std::string& source, const std::string& base_dir,
                               const std::vector<std::string>& overrides = {});

/// Levenshtein distance (for did-you-mean suggestions).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace mfsdp
