#include "models/gpt_hf.h"

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

void export_hf_gpt2(const std::string& path, const GPTConfig& cfg, const NamedTensors& params, DType dtype,
                    const std::map<std::string, std::string>& extra_metadata) {
  const ParamInventory inv = gpt_inventory(cfg);
  const std::string who = "[export_hf_gpt2] " + path + ": ";
  std::set<std::string> expected;
  for (const ParamSpec& p : inv.params) expected.insert(p.name);
  for (const auto& [name, data] : params)
    if (!expected.count(name)) throw std::invalid_argument(who + "parameter '" + name + "' is not in the GPT-2 inventory");

  std::vector<std::vector<float>> f32_store;
  std::vector<std::vector<uint16_t>> bf16_store;
  std::vector<TensorView> views;
  f32_store.reserve(inv.params.size());
  bf16_store.reserve(inv.params.size());
  for (const ParamSpec& p : inv.params) {
    auto it = params.find(p.name);
    if (it == params.end()) throw std::invalid_argument(who + "missing parameter '" + p.name + "'");
    if (static_cast<int64_t>(it->second.size()) != p.numel())
      throw std::invalid_argument(who + p.name + ": has " + std::to_string(it->second.size()) +
                                  " elements, shape " + shape_str(p.shape) + " needs " + std::to_string(p.numel()));
    const std::vector<int64_t> fs = file_shape(p, cfg);
    std::vector<float> v;
    if (hf_gpt2_is_conv1d(p.name)) {
      v = transpose(it->second, p.shape[0], p.shape[1]);
    } else if (is_vocab_rows(p.name)) {
      v.assign(it->second.begin(), it->second.begin() + fs[0] * fs[1]);
    } else {
      v = it->second;
    }
    if (dtype == DType::bf16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]).bits;
      bf16_store.push_back(std::move(h));
      views.push_back(TensorView{p.name, "BF16", fs, bf16_store.back().data()});
    } else {
      f32_store.push_back(std::move(v));
      views.push_back(TensorView{p.name, "F32", fs, f32_store.back().data()});
    }
  }
  std::map<std::string, std::string> meta = extra_metadata;
  meta["format"] = "mfsdp-hf-gpt2";
  meta["n_layer"] = std::to_string(cfg.n_layer);
  meta["n_head"] = std::to_string(cfg.n_head);
  meta["n_embd"] = std::to_string(cfg.n_embd);
  meta["seq_len"] = std::to_string(cfg.seq_len);
  meta["vocab_size"] = std::to_string(cfg.vocab_size);
  meta["tie_embeddings"] = cfg.tie_embeddings ? "true" : "false";
  write_safetensors(path, views, meta);
}

NamedTensors import_hf_gpt2(const std::string& path, const GPTConfig& cfg) {
  const ParamInventory inv = gpt_inventory(cfg);
  const SafetensorsFile file(path);
  const std::string who = "[import_hf_gpt2] " + path + ": ";
  NamedTensors out;
  std::set<std::string> used;
  for (const ParamSpec& p : inv.params) {
    if (!file.contains(p.name))
      throw std::runtime_error(who + p.name + ": missing from the file" +
                               (p.name == "lm_head.weight" ? " (was the model exported with tie_embeddings?)" : ""));
    const TensorInfo& t = file.info(p.name);
    const std::vector<int64_t> fs = file_shape(p, cfg);
    if (t.shape != fs)
      throw std::runtime_error(who + p.name + ": expected shape " + shape_str(fs) + ", file has " + shape_str(t.shape));
    std::vector<float> v;
    try {
      v = file.read_f32(p.name);
    } catch (const SafetensorsError& e) {
      throw std::runtime_error(who + p.name + ": " + e.what());
    }
    if (hf_gpt2_is_conv1d(p.name)) {
      v = transpose(v, fs[0], fs[1]);
    } else if (is_vocab_rows(p.name)) {
      v.resize(static_cast<size_t>(p.numel()), 0.0f);
    }
    out.emplace(p.name, std::move(v));
    used.insert(p.name);
  }
  static const std::regex mask_buffer(R"(h\.\d+\.attn\.(masked_)?bias)");
  for (const std::string& name : file.names()) {
    if (used.count(name)) continue;
    if (std::regex_match(name, mask_buffer) && file.info(name).shape.size() > 1) continue;
    if (std::regex_match(name, mask_buffer) && file.info(name).shape.empty()) continue;  // masked_bias scalar
    throw std::runtime_error(who + name + ": not a parameter of this config" +
                             (name == "lm_head.weight" ? " (the config has tie_embeddings = true)" : "") +
                             (name.rfind("transformer.", 0) == 0 ? " (strip the 'transformer.' prefix)" : ""));
  }
  return out;
}

GPTConfig read_hf_gpt2_config(const std::string& path) {
  const SafetensorsFile file(path);
  const auto& m = file.metadata();
  const std::string who = "[read_hf_gpt2_config] " + path + ": ";
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
