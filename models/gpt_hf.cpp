#include "models/gpt_hf.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <stdexcept>

#include "checkpoint/safetensors.h"

namespace mfsdp {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_vocab_rows(const std::string& name) { return name == "wte.weight" || name == "lm_head.weight"; }

// Shape of a parameter in the file, from its inventory shape.
std::vector<int64_t> file_shape(const ParamSpec& p, const GPTConfig& cfg) {
  if (hf_gpt2_is_conv1d(p.name)) return {p.shape[1], p.shape[0]};
  if (is_vocab_rows(p.name)) return {cfg.vocab_size, p.shape[1]};
  return p.shape;
}

// rows x cols row-major -> cols x rows row-major.
std::vector<float> transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> out(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = a[r * cols + c];
  return out;
}

}  // namespace

bool hf_gpt2_is_conv1d(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

nlohmann::json hf_gpt2_config_json(const GPTConfig& cfg) {
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                      {"model_type", "gpt2"},
                      {"vocab_size", cfg.vocab_size},
                      {"n_positions", cfg.seq_len},
                      {"n_ctx", cfg.seq_len},
                      {"n_embd", cfg.n_embd},
                      {"n_layer", cfg.n_layer},
                      {"n_head", cfg.n_head},
                      {"n_inner", nullptr},
                      {"activation_function", "gelu_new"},
                      {"layer_norm_epsilon", kGptLayerNormEps},
                      {"initializer_range", cfg.init_std},
                      {"tie_word_embeddings", cfg.tie_embeddings},
                      {"torch_dtype", "float32"}};
  if (cfg.vocab_size > 50256) j["bos_token_id"] = j["eos_token_id"] = 50256;  // <|endoftext|>
  return j;
}

namespace {

// The config.json fields that change GPT-2's maths, checked against what models/gpt.cpp
// implements. Accepted as they come: dropout probabilities (training noise; runs here train
// without dropout), reorder_and_upcast_attn (the same function, only a precision choice of
// transformers' fp16 attention), and fields of other heads or of generation.
std::string gpt2_maths_mismatch(const nlohmann::json& config, int64_t n_embd, const std::string& where) {
  const int64_t inner = hf_config_int(config, "n_inner", 4 * n_embd, where);
  if (inner != 4 * n_embd) return where + ": n_inner " + std::to_string(inner) + " is not 4 * n_embd";
  const std::string act = hf_config_string(config, "activation_function", "gelu_new", where);
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")  // three names of the tanh GELU
    return where + ": activation_function \"" + act +
           "\" (only the tanh GELU is implemented: gelu_new, gelu_pytorch_tanh or gelu_fast)";
  const double eps = hf_config_num(config, "layer_norm_epsilon", kGptLayerNormEps, where);
  if (std::fabs(eps - kGptLayerNormEps) > 1e-9 * kGptLayerNormEps)
    return where + ": layer_norm_epsilon is " + nlohmann::json(eps).dump() + " (only GPT-2's " +
           nlohmann::json(kGptLayerNormEps).dump() + " is implemented)";
  if (!hf_config_bool(config, "scale_attn_weights", true, where))
    return where + ": scale_attn_weights is false (only attention scores scaled by 1/sqrt(head_dim) are implemented)";
  if (hf_config_bool(config, "scale_attn_by_inverse_layer_idx", false, where))
    return where + ": scale_attn_by_inverse_layer_idx is true (only the unscaled layers of GPT-2 are implemented)";
  if (hf_config_bool(config, "add_cross_attention", false, where))
    return where + ": add_cross_attention is true (only the decoder without cross-attention is implemented)";
  return "";
}

}  // namespace

std::string hf_gpt2_config_mismatch(const nlohmann::json& config, const GPTConfig& cfg) {
  const std::string where = "config.json";
  const std::string type = hf_config_string(config, "model_type", "", where);
  if (type != "gpt2") return where + ": model_type is \"" + type + "\", model.arch is \"gpt2\"";
  const std::string e = hf_int_mismatch(config,
                                        {{"n_layer", cfg.n_layer, "model.n_layer"},
                                         {"n_head", cfg.n_head, "model.n_head"},
                                         {"n_embd", cfg.n_embd, "model.n_embd"},
                                         {"vocab_size", cfg.vocab_size, "model.vocab_size"}},
                                        where);
  if (!e.empty()) return e;
  const int64_t n_pos = hf_config_int(config, "n_positions", 1024, where);
  if (n_pos < cfg.seq_len)
    return where + ": n_positions is " + std::to_string(n_pos) + ", smaller than model.seq_len " + std::to_string(cfg.seq_len);
  if (std::string m = gpt2_maths_mismatch(config, cfg.n_embd, where); !m.empty()) return m;
  const bool tied = hf_config_bool(config, "tie_word_embeddings", true, where);
  if (tied != cfg.tie_embeddings)
    return where + std::string(": tie_word_embeddings is ") + (tied ? "true" : "false") + " but model.tie_embeddings is " +
           (cfg.tie_embeddings ? "true" : "false");
  return "";
}

void export_hf_gpt2(const std::string& path, const GPTConfig& cfg, const ParamSource& params, DType dtype,
                    const std::map<std::string, std::string>& extra_metadata) {
  const ParamInventory inv = gpt_inventory(cfg);
  const std::string who = "[export_hf_gpt2] " + path + ": ";
  params.check(inv, who, "GPT-2");
  // A from_pretrained directory carries GPT2LMHeadModel's names ("transformer." before the body):
  // transformers loads an untied head only then.
  const HfExportPaths out = hf_export_paths(path);
  std::vector<NamedArray> tensors;  // names and shapes; the values stream in as the file is written
  for (const ParamSpec& p : inv.params) {
    const bool prefixed = !out.config.empty() && p.name != "lm_head.weight";
    tensors.push_back(NamedArray{prefixed ? "transformer." + p.name : p.name, file_shape(p, cfg), {}});
  }
  auto values_of = [&](size_t i) {
    const ParamSpec& p = inv.params[i];
    std::vector<float> v = params(p);
    if (hf_gpt2_is_conv1d(p.name)) return transpose(v, p.shape[0], p.shape[1]);
    if (is_vocab_rows(p.name)) v.resize(static_cast<size_t>(tensors[i].shape[0] * tensors[i].shape[1]));
    return v;
  };
  std::map<std::string, std::string> meta = extra_metadata;
  meta["format"] = "pt";  // what transformers requires of a from_pretrained file
  meta["mfsdp_layout"] = "hf-gpt2";
  meta["n_layer"] = std::to_string(cfg.n_layer);
  meta["n_head"] = std::to_string(cfg.n_head);
  meta["n_embd"] = std::to_string(cfg.n_embd);
  meta["seq_len"] = std::to_string(cfg.seq_len);
  meta["vocab_size"] = std::to_string(cfg.vocab_size);
  meta["tie_embeddings"] = cfg.tie_embeddings ? "true" : "false";
  if (!out.config.empty()) std::filesystem::create_directories(path);
  write_f32_safetensors(out.weights, tensors, dtype, meta, values_of);
  if (!out.config.empty()) write_hf_config(out.config, hf_gpt2_config_json(cfg));
}

ParamReader open_hf_gpt2(const std::string& path, const GPTConfig& cfg) {
  const ParamInventory inv = gpt_inventory(cfg);
  const auto file = std::make_shared<const HfCheckpoint>(path);
  const std::string who = "[import_hf_gpt2] " + path + ": ";
  if (!file->config().is_null()) {
    std::string e;
    try {  // a field of the wrong type throws, naming it
      e = hf_gpt2_config_mismatch(file->config(), cfg);
    } catch (const std::runtime_error& x) {
      e = x.what();
    }
    if (!e.empty()) throw std::runtime_error(who + e);
  }
  // transformers' save_pretrained prefixes the body with "transformer."; our exports do not.
  auto stored = [&](const std::string& name) {
    return !file->contains(name) && file->contains("transformer." + name) ? "transformer." + name : name;
  };
  std::map<std::string, std::string> file_name;  // our name -> the file's, every shape checked
  for (const ParamSpec& p : inv.params) {
    const std::string fname = stored(p.name);
    if (!file->contains(fname))
      throw std::runtime_error(who + p.name + ": missing from the file" +
                               (p.name == "lm_head.weight" ? " (was the model exported with tie_embeddings?)" : ""));
    const TensorInfo& t = file->info(fname);
    const std::vector<int64_t> fs = file_shape(p, cfg);
    const bool longer_wpe = p.name == "wpe.weight" && t.shape.size() == 2 && t.shape[1] == fs[1] && t.shape[0] > fs[0];
    if (t.shape != fs && !longer_wpe)
      throw std::runtime_error(who + p.name + ": expected shape " + shape_str(fs) + ", file has " + shape_str(t.shape));
    file_name[p.name] = fname;
  }
  std::set<std::string> used;
  for (const auto& [ours, theirs] : file_name) used.insert(theirs);
  static const std::regex mask_buffer(R"((transformer\.)?h\.\d+\.attn\.(masked_)?bias)");
  for (const std::string& name : file->names()) {
    if (used.count(name)) continue;
    if (std::regex_match(name, mask_buffer) && file->info(name).shape.size() != 1) continue;  // buffers, not biases
    throw std::runtime_error(who + name + ": not a parameter of this config" +
                             (name == "lm_head.weight" ? " (the config has tie_embeddings = true)" : ""));
  }
  return [file, file_name, cfg, who](const ParamSpec& p) {
    const auto it = file_name.find(p.name);
    if (it == file_name.end()) throw std::runtime_error(who + p.name + ": not a parameter of this model");
    std::vector<float> v;
    try {
      v = file->read_f32(it->second);
    } catch (const SafetensorsError& e) {
      throw std::runtime_error(who + p.name + ": " + e.what());
    }
    const std::vector<int64_t> fs = file_shape(p, cfg);
    if (hf_gpt2_is_conv1d(p.name)) return transpose(v, fs[0], fs[1]);
    v.resize(static_cast<size_t>(p.numel()), 0.0f);  // pad vocabulary rows / keep the first seq_len positions
    return v;
  };
}

NamedTensors import_hf_gpt2(const std::string& path, const GPTConfig& cfg) {
  return read_all(gpt_inventory(cfg), open_hf_gpt2(path, cfg));
}

GPTConfig read_hf_gpt2_config(const std::string& path) {
  const HfCheckpoint file(path);
  const std::string who = "[read_hf_gpt2_config] " + path + ": ";
  if (!file.config().is_null()) {  // a Hugging Face directory: config.json
    const nlohmann::json& c = file.config();
    GPTConfig cfg;
    cfg.n_layer = static_cast<int>(hf_config_int(c, "n_layer", 12, who + "config.json"));
    cfg.n_head = static_cast<int>(hf_config_int(c, "n_head", 12, who + "config.json"));
    cfg.n_embd = static_cast<int>(hf_config_int(c, "n_embd", 768, who + "config.json"));
    cfg.seq_len = static_cast<int>(hf_config_int(c, "n_positions", 1024, who + "config.json"));
    cfg.vocab_size = static_cast<int>(hf_config_int(c, "vocab_size", 50257, who + "config.json"));
    cfg.tie_embeddings = hf_config_bool(c, "tie_word_embeddings", true, who + "config.json");
    return cfg;
  }
  const auto m = file.metadata();
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = m.find(key);
    if (it == m.end()) throw std::runtime_error(who + "metadata has no '" + key + "'");
    return it->second;
  };
  auto get_int = [&](const std::string& key) {
    const std::string& s = get(key);
    try {
      size_t used = 0;
      const int v = std::stoi(s, &used);
      if (used != s.size()) throw std::invalid_argument(s);
      return v;
    } catch (const std::exception&) {
      throw std::runtime_error(who + "metadata '" + key + "' = '" + s + "' is not an integer");
    }
  };
  GPTConfig cfg;
  cfg.n_layer = get_int("n_layer");
  cfg.n_head = get_int("n_head");
  cfg.n_embd = get_int("n_embd");
  cfg.seq_len = get_int("seq_len");
  cfg.vocab_size = get_int("vocab_size");
  const std::string& tie = get("tie_embeddings");
  if (tie != "true" && tie != "false")
    throw std::runtime_error(who + "metadata 'tie_embeddings' = '" + tie + "' is not true/false");
  cfg.tie_embeddings = tie == "true";
  try {
    cfg.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(who + e.what());
  }
  return cfg;
}

}  // namespace mfsdp
