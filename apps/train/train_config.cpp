#include "apps/train/train_config.h"

#include "runtime/core/file_checks.h"
#include "apps/train/preemption.h"
#include "runtime/core/json_fields.h"
#include "runtime/core/json_limits.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/data/token_shards.h"

namespace mfsdp {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Leaves whose default is null: their type cannot be read from the defaults.
const std::map<std::string, std::string> kNullableNumber = {{"training.target_val_loss", "a number or null"},
                                                            {"training.global_batch_size", "an integer >= 1 or null"},
                                                            {"logging.peak_tflops", "a number or null"}};

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

// Appends `v` as compact JSON to `out` until `out` holds `limit` characters: never more work, and
// never deeper recursion, than the limit allows, whatever the value's size or nesting.
void append_clipped(const json& v, std::string& out, size_t limit) {
  if (out.size() >= limit) return;
  if (!v.is_structured()) {
    out += v.dump(-1, ' ', false, json::error_handler_t::replace);  // a --set value may hold any bytes
    return;
  }
  out += v.is_array() ? '[' : '{';
  bool first = true;
  for (auto it = v.begin(); it != v.end() && out.size() < limit; ++it, first = false) {
    if (!first) out += ',';
    if (v.is_object()) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ':';
    append_clipped(it.value(), out, limit);
  }
  out += v.is_array() ? ']' : '}';
}

std::string shown(const json& v) {
  std::string s;
  append_clipped(v, s, 60);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string join(const std::string& prefix, const std::string& key) { return prefix.empty() ? key : prefix + "." + key; }

void collect_paths(const json& schema, const std::string& prefix, std::vector<std::string>& out) {
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string p = join(prefix, it.key());
    out.push_back(p);
    if (it.value().is_object()) collect_paths(it.value(), p, out);
  }
}

std::string last_component(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string suggest(const json& schema, const std::string& path) {
  std::vector<std::string> all;
  collect_paths(schema, "", all);
  const std::string key = last_component(path);
  std::vector<std::string> same_name;
  for (const std::string& p : all)
    if (last_component(p) == key && p != path) same_name.push_back(p);
  if (!same_name.empty()) {
    std::string s = " (did you mean " + same_name[0];
    for (size_t i = 1; i < same_name.size(); ++i) s += " or " + same_name[i];
    return s + "?)";
  }
  size_t best = SIZE_MAX;
  std::string best_path;
  for (const std::string& p : all) {
    const size_t d = edit_distance(path, p);
    if (d < best) {
      best = d;
      best_path = p;
    }
  }
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  return best <= limit ? " (did you mean " + best_path + "?)" : "";
}

// Node of `schema` at a dotted path, or nullptr.
const json* schema_at(const json& schema, const std::string& path) {
  const json* node = &schema;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!node->is_object() || !node->contains(part)) return nullptr;
    node = &(*node)[part];
  }
  return node;
}

class Checker {
 public:
  Checker(const json& schema) : schema_(schema) {}

  // Structural check of `value` placed at `path`, labelled `where` in messages.
  void check(const json& value, const std::string& path, const std::string& where) const {
    const json* s = schema_at(schema_, path);
    if (!s) throw ConfigError(where + ": " + path + ": unknown key" + suggest(schema_, path));
    if (s->is_object()) {
      if (!value.is_object())
        throw ConfigError(where + ": " + path + ": expected an object (a config section), got " + shown(value));
      for (auto it = value.begin(); it != value.end(); ++it) check(it.value(), join(path, it.key()), where);
      return;
    }
    check_leaf(*s, value, path, where);
  }

  void check_top(const json& doc, const std::string& where) const {
    if (!doc.is_object()) throw ConfigError(where + ": expected a JSON object at the top level, got " + type_name(doc));
    for (auto it = doc.begin(); it != doc.end(); ++it) check(it.value(), it.key(), where);
  }

 private:
  static void check_leaf(const json& def, const json& v, const std::string& path, const std::string& where) {
    auto fail = [&](const std::string& expected) {
      throw ConfigError(where + ": " + path + ": expected " + expected + ", got " + shown(v));
    };
    if (def.is_null()) {
      auto it = kNullableNumber.find(path);
      if (!v.is_null() && !v.is_number()) fail(it != kNullableNumber.end() ? it->second : "null");
      return;
    }
    if (def.is_boolean()) {
      if (!v.is_boolean()) fail("a boolean (true or false)");
    } else if (def.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) fail("an integer in range");
      if (v.is_number_float()) {
        const double d = v.get<double>();
        if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e18) fail("an integer");
      } else if (!v.is_number_integer()) {
        fail("an integer");
      }
    } else if (def.is_number()) {
      if (!v.is_number()) fail("a number");
    } else if (def.is_string()) {
      if (!v.is_string()) fail("a string");
    }
  }

  const json& schema_;
};

// The smallest epsilon a config may give (model.norm_eps, optimizer.adamw.eps): the kernels add
// it in f32, where a value below about 1.2e-38 is subnormal or flushed to 0, and 0 / (0 + eps)
// is then NaN; 1e-30 keeps every quotient it guards finite.
constexpr double kMinEpsilon = 1e-30;

int64_t as_int(const json& v) { return v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>(); }

// Deep merge of `patch` onto `base` (objects merged, leaves replaced; null is a value, not a delete).
void deep_merge(json& base, const json& patch) {
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    if (it.value().is_object() && base.contains(it.key()) && base[it.key()].is_object())
      deep_merge(base[it.key()], it.value());
    else
      base[it.key()] = it.value();
  }
}

void set_at(json& doc, const std::string& path, const json& value) {
  json* node = &doc;
  std::stringstream ss(path);
  std::string part;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->contains(parts[i]) || !(*node)[parts[i]].is_object()) (*node)[parts[i]] = json::object();
    node = &(*node)[parts[i]];
  }
  json& target = (*node)[parts.back()];
  if (value.is_object() && target.is_object()) deep_merge(target, value);
  else target = value;
}

// Records, for every leaf of `doc`, where it came from.
void record_origin(const json& doc, const std::string& prefix, const std::string& where,
                   std::map<std::string, std::string>& origin) {
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string p = join(prefix, it.key());
    if (it.value().is_object()) record_origin(it.value(), p, where, origin);
    else origin[p] = where;
  }
}


std::string resolve(const std::string& raw, const std::string& base) {
  if (raw.empty()) return raw;
  fs::path p(raw);
  if (p.is_absolute()) return p.lexically_normal().string();
  return fs::absolute(fs::path(base) / p).lexically_normal().string();
}

// Reads the effective (merged, type-checked) document into the struct and range-checks it.
class Reader {
 public:
  Reader(const json& doc, const std::map<std::string, std::string>& origin, const std::string& default_where)
      : doc_(doc), origin_(origin), default_where_(default_where) {}

  const json& at(const std::string& path) const {
    const json* v = schema_at(doc_, path);
    if (!v) throw ConfigError(default_where_ + ": " + path + ": missing");  // not reachable after merging defaults
    return *v;
  }
  std::string where(const std::string& path) const {
    auto it = origin_.find(path);
    return it != origin_.end() ? it->second : default_where_;
  }
  /// The value at `path`, read by the one typed-field reader (runtime/core/json_fields.h): errors
  /// are "<where the value came from>: <path>: <why>".
  JsonFields<ConfigError>::Field field(const std::string& path) const {
    return JsonFields<ConfigError>(where(path)).field(at(path), path);
  }
  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    JsonFields<ConfigError>(where(path)).fail(path, why);
  }
  /// Integers: the checker lets whole floats through (2.0), so they are narrowed here.
  int64_t i64(const std::string& path, int64_t lo, int64_t hi = INT64_MAX) const {
    return field(path).within(as_int(at(path)), lo, hi);
  }
  int i32(const std::string& path, int64_t lo, int64_t hi = INT_MAX) const { return static_cast<int>(i64(path, lo, hi)); }
  double num(const std::string& path, double lo, double hi, bool lo_open = false, bool hi_open = false) const {
    return field(path).number(lo, hi, lo_open, hi_open);
  }
  bool flag(const std::string& path) const { return field(path).boolean(); }
  /// True when the config file or a --set override wrote `path` (not just the default).
  bool given(const std::string& path) const { return origin_.count(path) != 0; }
  /// The string at `path`; every string of a config must be UTF-8 (it is echoed as JSON).
  std::string str(const std::string& path) const {
    std::string v = field(path).string();
    if (const std::string bad = utf8_problem(v); !bad.empty()) fail(path, bad + "; config strings must be UTF-8");
    return v;
  }
  std::string choice(const std::string& path, const std::vector<std::string>& allowed) const {
    const std::string v = str(path);
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return v;
    std::string list, best;
    size_t best_d = SIZE_MAX;
    for (const std::string& a : allowed) {
      list += (list.empty() ? "" : ", ") + (a.empty() ? std::string("\"\"") : a);
      const size_t d = edit_distance(v, a);
      if (d < best_d) {
        best_d = d;
        best = a;
      }
    }
    const std::string hint = best_d <= std::max<size_t>(2, v.size() / 3) ? " (did you mean " + best + "?)" : "";
    fail(path, "unknown value \"" + v + "\", expected one of " + list + hint);
  }
  /// The value of enumeration E named at `path`, one of `table`'s names.
  template <class E, size_t N>
  E choice(const std::string& path, const NameTable<E, N>& table) const {
    return *table.find(choice(path, table.names()));
  }
  ConfigPath path_value(const std::string& path, const std::string& base_dir) const {
    ConfigPath p;
    p.raw = str(path);
    const bool from_file = origin_.count(path) && origin_.at(path) == default_where_;
    p.resolved = resolve(p.raw, from_file ? base_dir : fs::current_path().string());
    if (const std::string bad = utf8_problem(p.resolved); !bad.empty())
      fail(path, "resolves to a path that is " + bad + " (the " +
                     (from_file ? "config file's directory" : "working directory") + " is not UTF-8)");
    return p;
  }

 private:
  const json& doc_;
  const std::map<std::string, std::string>& origin_;
  std::string default_where_;
};

// model.* keys of the MoE family: read for model.arch "qwen2_moe", refused when set otherwise.
void read_moe(const Reader& r, ModelSection& m) {
  if (m.arch != "qwen2_moe") {
    const ModelSection d;
    const std::pair<const char*, json> moe_only[] = {
        {"model.num_experts", d.num_experts},
        {"model.num_experts_per_tok", d.num_experts_per_tok},
        {"model.moe_intermediate_size", d.moe_intermediate_size},
        {"model.shared_expert_intermediate_size", d.shared_expert_intermediate_size},
        {"model.norm_topk_prob", d.norm_topk_prob},
        {"model.router_aux_loss_coef", d.router_aux_loss_coef},
        {"model.router_z_loss_coef", d.router_z_loss_coef},
        {"model.router_optimizer", d.router_optimizer}};
    for (const auto& [k, def] : moe_only)
      if ((!r.at(k).is_string() || !r.str(k).empty()) && r.at(k) != def) r.fail(k, "only applies to model.arch \"qwen2_moe\" (model.arch is \"" + m.arch + "\")");
    return;
  }
  m.num_experts = r.i32("model.num_experts", 1, 1 << 16);
  m.num_experts_per_tok = r.i32("model.num_experts_per_tok", 1, m.num_experts);
  m.moe_intermediate_size = r.i32("model.moe_intermediate_size", 0, 1 << 20);
  m.moe_intermediate_size = m.moe().moe_intermediate_size;
  m.shared_expert_intermediate_size = r.i32("model.shared_expert_intermediate_size", 0, 1 << 20);
  m.norm_topk_prob = r.flag("model.norm_topk_prob");
  m.router_aux_loss_coef = r.num("model.router_aux_loss_coef", 0.0, 1e3);
  m.router_z_loss_coef = r.num("model.router_z_loss_coef", 0.0, 1e3);
  m.router_optimizer = r.choice("model.router_optimizer", {"adamw", "muon"});
  if (!m.init_from.raw.empty())
    if (const std::string why = hf_moe_layout_refusal(m.moe()); !why.empty()) r.fail("model.init_from", why);
}

// The MoE op (runtime/ops_moe.h) runs in f32: refuse what would reach it otherwise.
void check_moe_runtime(const Reader& r, const TrainConfig& c) {
  const std::string why = " (model.arch \"qwen2_moe\": the MoE op runs f32 only, for now)";
  if (c.optim.param_dtype != DType::f32) r.fail("precision.param_dtype", "must be f32" + why);
  if (c.precision.matmul == DTypeChoice::bf16) r.fail("precision.matmul_dtype", "must not be bf16" + why);
  if (!c.output.export_path.raw.empty())
    if (const std::string why = hf_moe_layout_refusal(c.model.moe()); !why.empty()) r.fail("output.export", why);
}

void read_model(const Reader& r, const std::string& base_dir, ModelSection& m) {
  m.n_layer = r.i32("model.n_layer", 1, 1 << 12);  // bounds keep every size product in int64
  m.n_head = r.i32("model.n_head", 1, 1 << 12);
  m.n_embd = r.i32("model.n_embd", 1, 1 << 17);
  if (m.n_embd % m.n_head != 0)
    r.fail("model.n_embd", "must be divisible by model.n_head (" + std::to_string(m.n_embd) + " % " +
                               std::to_string(m.n_head) + " = " +
                               std::to_string(m.n_embd % m.n_head) + ")");
  m.seq_len = r.i32("model.seq_len", 1, 1 << 20);
  {
    const int64_t v = r.i64("model.vocab_size", 2);
    if (v > kMaxVocabU32)
      r.fail("model.vocab_size", std::to_string(v) + " is larger than the shard format allows (max " +
                                     std::to_string(kMaxVocabU32) + " with 32-bit token shards)");
    m.vocab_size = v;
  }
  m.init_from = r.path_value("model.init_from", base_dir);
  m.init_std = r.num("model.init_std", 0.0, 1e3, true);
  m.arch = r.choice("model.arch", {"gpt2", "llama", "qwen2_moe"});
  if (m.arch != "gpt2") {
    // Llama's (and the MoE family's) head is untied unless the config says otherwise.
    m.tie_embeddings = r.given("model.tie_embeddings") && r.flag("model.tie_embeddings");
    m.n_kv_head = r.i32("model.n_kv_head", 0, 1 << 12);
    if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
    if (m.n_head % m.n_kv_head != 0)
      r.fail("model.n_kv_head", "must divide model.n_head (" + std::to_string(m.n_head) + " % " +
                                    std::to_string(m.n_kv_head) + " != 0)");
    if ((m.n_embd / m.n_head) % 2 != 0)
      r.fail("model.n_embd", "model.n_embd / model.n_head must be even for rotary embeddings, got " +
                                 std::to_string(m.n_embd / m.n_head));
    m.intermediate_size = r.i32("model.intermediate_size", 0, 1 << 20);
    m.intermediate_size = m.llama().intermediate_size;
    m.norm_eps = r.num("model.norm_eps", kMinEpsilon, 1.0);
    // Frequencies theta^(-2i/d) above one radian per position (theta < 1) only alias, and a
    // theta that f32 rounds to 0 or a subnormal makes them infinite.
    m.rope_theta = r.num("model.rope_theta", 1.0, 1e12);
  } else {
    m.tie_embeddings = r.flag("model.tie_embeddings");
    const ModelSection d;
    const std::pair<const char*, json> llama_only[] = {{"model.n_kv_head", d.n_kv_head},
                                                       {"model.intermediate_size", d.intermediate_size},
                                                       {"model.norm_eps", d.norm_eps},
                                                       {"model.rope_theta", d.rope_theta}};
    for (const auto& [k, def] : llama_only)
      if (r.at(k) != def) r.fail(k, "only applies to model.arch \"llama\" or \"qwen2_moe\" (model.arch is \"gpt2\")");
  }
  read_moe(r, m);
}

void read_data(const Reader& r, const std::string& base_dir, int64_t vocab_size, DataSection& d) {
  d.train = r.path_value("data.train", base_dir);
  if (d.train.raw.empty())
    r.fail("data.train", "missing shard glob (set data.train, e.g. \"../data/tiny_shakespeare_char_train.bin\")");
  d.val = r.path_value("data.val", base_dir);
  d.tokenizer = r.choice("data.tokenizer", {"", "char", "gpt2"});
  d.tokenizer_path = r.path_value("data.tokenizer_path", base_dir);
  if (!d.tokenizer.empty() && d.tokenizer_path.raw.empty())
    r.fail("data.tokenizer_path", "required when data.tokenizer is \"" + d.tokenizer + "\"");
  if (d.tokenizer == "gpt2" && vocab_size < 50257)
    r.fail("model.vocab_size", std::to_string(vocab_size) + " is smaller than the gpt2 tokenizer's 50257 ids");
  d.shuffle = r.flag("data.shuffle");
  d.seed = r.i64("data.seed", 0);
}

// optimizer.* and training.grad_clip (EngineOptions), with the checks that span both sections.
void read_optimizer(const Reader& r, EngineOptions& o, PrecisionSection& precision) {
  o.muon.lr = r.num("optimizer.muon.lr", 0.0, 1e6);
  o.muon.momentum = r.num("optimizer.muon.momentum", 0.0, 1.0, false, true);
  o.muon.nesterov = r.flag("optimizer.muon.nesterov");
  o.muon.ns_steps = r.i32("optimizer.muon.ns_steps", 1, 100);
  o.muon.weight_decay = r.num("optimizer.muon.weight_decay", 0.0, 1e6);
  o.muon.scale_rule = r.choice("optimizer.muon.scale_rule", kMuonScaleRuleNames);
  o.muon.split_qkv = r.flag("optimizer.muon.split_qkv");
  o.muon.orthogonalizer = r.choice("optimizer.muon.orthogonalizer", kOrthogonalizerNames);
  // auto is resolved at start-up (apps/train/run_precision.h); until then the rules see f32
  precision.ns = r.choice("optimizer.muon.ns_dtype", kNsChoiceNames);
  o.muon.ns_dtype = precision.ns == DTypeChoice::bf16 ? NsDType::bf16 : NsDType::f32;
  o.muon.variant = r.choice("optimizer.muon.variant", kMuonVariantNames);
  o.muon.beta2 = r.num("optimizer.muon.beta2", 0.0, 1.0, false, true);
  o.muon.split_heads = r.flag("optimizer.muon.split_heads");  // head_dim comes from the model
  o.qk_clip = r.num("optimizer.muon.qk_clip", 0.0, 1e6);
  o.overlap_backward = r.flag("optimizer.muon.overlap_backward");
  o.adamw.lr = r.num("optimizer.adamw.lr", 0.0, 1e6);
  o.adamw.beta1 = r.num("optimizer.adamw.beta1", 0.0, 1.0, false, true);
  o.adamw.beta2 = r.num("optimizer.adamw.beta2", 0.0, 1.0, false, true);
  o.adamw.eps = r.num("optimizer.adamw.eps", kMinEpsilon, 1.0);
  o.adamw.weight_decay = r.num("optimizer.adamw.weight_decay", 0.0, 1e6);
  o.grad_clip = r.num("training.grad_clip", 0.0, 1e12);
  // schedule
  o.schedule.warmup_steps = r.i64("schedule.warmup_steps", 0);
  o.schedule.kind = r.choice("schedule.decay", kDecayKindNames);
  o.schedule.floor = r.num("schedule.floor", 0.0, 1.0);
  o.schedule.decay_fraction = r.num("schedule.decay_fraction", 0.0, 1.0);
}

// runtime.device and sharding.backend: either may be left out; when both are set they must agree.
void read_device(const Reader& r, TrainConfig& c) {
  const Device device = r.choice("runtime.device", kDeviceNames);
  const CommBackend backend = r.choice("sharding.backend", kCommBackendNames);
  const bool device_given = r.given("runtime.device"), backend_given = r.given("sharding.backend");
  if (!backend_given) {
    c.runtime.device = device;
    c.sharding.backend = device == Device::CUDA ? CommBackend::nccl : CommBackend::mpi;
    return;
  }
  const Device backend_device = comm_backend_device(backend);
  if (device_given && device != backend_device)
    r.fail("sharding.backend", std::string(comm_backend_name(backend)) + " moves " +
                                   (backend_device == Device::CPU ? "host" : "CUDA") + " buffers, but runtime.device is " +
                                   device_name(device) + " (" + r.where("runtime.device") + "); use " +
                                   (device == Device::CPU ? "mpi" : "nccl or cuda_staged") +
                                   ", or leave sharding.backend out for the device's default");
  c.runtime.device = backend_device;
  c.sharding.backend = backend;
}

// The config key of each option resolve() may reject.
std::string config_key(OptionField f) {
  switch (f) {
    case OptionField::device: return "runtime.device";
    case OptionField::placement: return "sharding.placement";
    case OptionField::replicas: return "sharding.replicate";
    case OptionField::param_dtype: return "precision.param_dtype";
    case OptionField::reduce_dtype: return "precision.reduce_dtype";
    case OptionField::grad_clip: return "training.grad_clip";
    case OptionField::qk_clip: return "optimizer.muon.qk_clip";
    case OptionField::overlap_backward: return "optimizer.muon.overlap_backward";
    case OptionField::prefetch_depth: return "sharding.prefetch_depth";
    case OptionField::prefetch_limit_bytes: return "sharding.prefetch_limit_bytes";
    case OptionField::muon_split_heads: return "optimizer.muon.split_heads";
    case OptionField::muon_orthogonalizer: return "optimizer.muon.orthogonalizer";
    case OptionField::muon_variant: return "optimizer.muon.variant";
    case OptionField::muon_ns_dtype: return "optimizer.muon.ns_dtype";
    case OptionField::attention: return "runtime.attention";
    case OptionField::expert_parallel: return "sharding.expert_parallel";
  }
  return kOptionFieldNames.name(f);
}

// The engine's rules (resolve()) on the parsed options, for the model the config describes; a
// rejected option is reported at its config key, and so is every option its message names.
void check_engine_rules(const Reader& r, const TrainConfig& c) {
  try {
    resolve(c.optim, c.runtime.device, c.sharding.placement, c.sharding.replicate, c.model.facts());
  } catch (const OptionError& e) {
    r.fail(config_key(e.field()), e.message(config_key));
  }
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The sharding section after sharding.placement (read before the device, which it constrains).
void read_sharding(const Reader& r, TrainConfig& c) {
  c.sharding.replicate = r.i32("sharding.replicate", 1, 1 << 20);
  const int prefetch_depth = r.i32("sharding.prefetch_depth", -1, 64);  // -1: the device default
  if (prefetch_depth >= 0) c.optim.prefetch_depth = prefetch_depth;
  c.optim.prefetch_limit_bytes = r.i64("sharding.prefetch_limit_bytes", 0);
  c.optim.overlap_reduce = r.choice("sharding.overlap_reduce", kToggleNames);
  c.optim.expert_parallel = r.flag("sharding.expert_parallel");
  if (c.optim.expert_parallel && c.model.arch != "qwen2_moe")
    r.fail("sharding.expert_parallel", "needs a model with routed experts (model.arch \"qwen2_moe\"), got model.arch \"" +
                                           c.model.arch + "\"");
  c.sharding.memory_check = r.choice("sharding.memory_check", kMemoryCheckNames);
  c.sharding.debug_checks = r.flag("sharding.debug_checks");
  c.sharding.nccl_blocking = r.flag("sharding.nccl_blocking");
  c.sharding.reduce_chunk_bytes = r.i64("sharding.reduce_chunk_bytes", 4);
  c.sharding.collective_timeout_s = r.num("sharding.collective_timeout_s", 0.0, 1e7);
  if (c.sharding.collective_timeout_s > 0 && c.sharding.collective_timeout_s < 1)
    r.fail("sharding.collective_timeout_s", "must be 0 (wait forever) or >= 1 second");
}

TrainConfig parse_train_config(const json& doc, const std::string& source, const std::string& base_dir,
                               const std::vector<std::string>& overrides) {
  const json schema = TrainConfig{}.to_json(false);
  const Checker checker(schema);
  checker.check_top(doc, source);

  json merged = schema;
  deep_merge(merged, doc);
  std::map<std::string, std::string> origin;
  record_origin(doc, "", source, origin);

  std::map<std::string, std::string> overridden;  // key -> the --set that set it
  for (const std::string& ov : overrides) {
    const std::string where = "--set " + clip_for_message(ov);
    const size_t eq = ov.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(where + ": expected key.path=value");
    const std::string key = ov.substr(0, eq);
    if (const auto [it, fresh] = overridden.emplace(key, where); !fresh)
      throw ConfigError(where + ": " + key + " is already set by " + it->second + " (a key may be set once)");
    const json value = parse_config_json(ov.substr(eq + 1), where, /*plain_string_if_not_json=*/true);
    checker.check(value, key, where);
    set_at(merged, key, value);
    if (value.is_object()) record_origin(value, key, where, origin);
    else origin[key] = where;
  }

  const Reader r(merged, origin, source);
  TrainConfig c;
  c.source = source;
  read_model(r, base_dir, c.model);
  read_data(r, base_dir, c.model.vocab_size, c.data);
  read_optimizer(r, c.optim, c.precision);
  // sharding
  c.sharding.placement = r.choice("sharding.placement", kPlacementNames);
  read_device(r, c);
  c.optim.attention = r.choice("runtime.attention", kAttentionNames);
  c.optim.param_dtype = r.choice("precision.param_dtype", kPrecisionNames);
  c.optim.reduce_dtype = r.choice("precision.reduce_dtype", kPrecisionNames);
  c.precision.matmul = r.choice("precision.matmul_dtype", kMatmulChoiceNames);
  if (c.precision.matmul == DTypeChoice::f32 || c.precision.matmul == DTypeChoice::bf16)
    c.optim.matmul_dtype = c.precision.matmul == DTypeChoice::bf16 ? DType::bf16 : DType::f32;
  read_sharding(r, c);
  // training
  c.training.steps = r.i64("training.steps", 1);
  c.optim.schedule.total_steps = c.training.steps;
  c.training.micro_batch_size = r.i32("training.micro_batch_size", 1, 1 << 20);
  c.training.grad_accum = r.i32("training.grad_accum", 1, 1 << 20);
  if (!r.at("training.global_batch_size").is_null()) {
    c.training.global_batch_size = r.i64("training.global_batch_size", 1, int64_t{1} << 40);
    if (c.training.grad_accum != 1)
      r.fail("training.global_batch_size", "set it or training.grad_accum (" + std::to_string(c.training.grad_accum) +
                                               "), not both: grad_accum is derived from it at the run's world size");
  }
  c.training.eval_interval = r.i64("training.eval_interval", 0);
  c.training.eval_tokens = r.i64("training.eval_tokens", 0);
  c.training.seed = r.i64("training.seed", 0);
  if (!r.at("training.target_val_loss").is_null())
    c.training.target_val_loss = r.num("training.target_val_loss", 0.0, 1e6, true);
  c.training.sample_tokens = r.i64("training.sample_tokens", 0, 100000);
  c.optim.recompute_units = r.choice("training.recompute", kRecomputeNames);
  // logging, output
  c.logging.interval = r.i64("logging.interval", 1);
  if (!r.at("logging.peak_tflops").is_null()) c.logging.peak_tflops = r.num("logging.peak_tflops", 0.0, 1e9, true);
  c.logging.run_dir = r.path_value("logging.run_dir", base_dir);
  c.logging.trace = r.path_value("logging.trace", base_dir);
  c.logging.trace_start = r.i64("logging.trace_start", 1, int64_t(1) << 40);
  c.logging.trace_steps = r.i64("logging.trace_steps", 1, 1000);
  c.output.export_path = r.path_value("output.export", base_dir);
  if (c.model.arch == "qwen2_moe") check_moe_runtime(r, c);
  c.training.resume = r.str("training.resume");
  c.checkpoint.dir = r.path_value("checkpoint.dir", base_dir);
  c.checkpoint.interval = r.i64("checkpoint.interval", 0);
  c.checkpoint.keep_last = r.i32("checkpoint.keep_last", 0);
  c.checkpoint.at_end = r.flag("checkpoint.at_end");
  c.checkpoint.notice_signal = r.choice("checkpoint.notice_signal", notice_signal_names());
  check_engine_rules(r, c);
  return c;
}

}  // namespace mfsdp
