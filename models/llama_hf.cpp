#include "models/llama_hf.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <stdexcept>

#include "runtime/tensor.h"

namespace mfsdp {
namespace {

bool is_vocab_rows(const std::string& name) { return name == "model.embed_tokens.weight" || name == "lm_head.weight"; }

std::vector<int64_t> file_shape(const ParamSpec& p, const LlamaConfig& cfg) {
  if (is_vocab_rows(p.name)) return {cfg.vocab_size, p.shape[1]};
  return p.shape;
}

}  // namespace

nlohmann::json hf_decoder_config_json(const LlamaConfig& cfg, const char* architecture, const char* model_type,
                                      int64_t intermediate_size) {
  return {{"architectures", {architecture}},
          {"model_type", model_type},
          {"vocab_size", cfg.vocab_size},
          {"hidden_size", cfg.n_embd},
          {"intermediate_size", intermediate_size},
          {"num_hidden_layers", cfg.n_layer},
          {"num_attention_heads", cfg.n_head},
          {"num_key_value_heads", cfg.n_kv_head},
          {"max_position_embeddings", cfg.seq_len},
          {"hidden_act", "silu"},
          {"rms_norm_eps", cfg.norm_eps},
          {"rope_theta", cfg.rope_theta},
          {"initializer_range", cfg.init_std},
          {"tie_word_embeddings", cfg.tie_embeddings},
          {"torch_dtype", "float32"}};
}

nlohmann::json hf_llama_config_json(const LlamaConfig& cfg) {
  nlohmann::json j = hf_decoder_config_json(cfg, "LlamaForCausalLM", "llama", cfg.intermediate_size);
  j["head_dim"] = cfg.head_dim();
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  return j;
}

std::string hf_llama_shared_mismatch(const nlohmann::json& config, const LlamaConfig& cfg, const std::string& where) {
  const int64_t heads = hf_config_int(config, "num_attention_heads", -1, where);
  nlohmann::json c = config;  // num_key_value_heads absent or null: one per attention head
  if (!c.contains("num_key_value_heads") || c["num_key_value_heads"].is_null()) c["num_key_value_heads"] = heads;
  const std::string e = hf_int_mismatch(c,
                                        {{"num_hidden_layers", cfg.n_layer, "model.n_layer"},
                                         {"num_attention_heads", cfg.n_head, "model.n_head"},
                                         {"num_key_value_heads", cfg.n_kv_head, "model.n_kv_head"},
                                         {"hidden_size", cfg.n_embd, "model.n_embd"},
                                         {"vocab_size", cfg.vocab_size, "model.vocab_size"}},
                                        where);
  if (!e.empty()) return e;
  const int64_t hd = hf_config_int(config, "head_dim", cfg.head_dim(), where);
  if (hd != cfg.head_dim())
    return where + ": head_dim is " + std::to_string(hd) + ", only hidden_size / num_attention_heads (" +
           std::to_string(cfg.head_dim()) + ") is supported";
  const std::pair<const char*, std::pair<double, const char*>> nums[] = {
      {"rms_norm_eps", {cfg.norm_eps, "model.norm_eps"}}, {"rope_theta", {cfg.rope_theta, "model.rope_theta"}}};
  for (const auto& [key, want] : nums) {
    const double v = hf_config_num(config, key, key == std::string("rope_theta") ? 10000.0 : 1e-6, where);
    if (std::fabs(v - want.first) > 1e-9 * std::fabs(want.first))
      return where + ": " + key + " is " + nlohmann::json(v).dump() + " but " + want.second + " is " +
             nlohmann::json(want.first).dump();
  }
  if (config.contains("rope_scaling") && !config["rope_scaling"].is_null())
    return where + ": rope_scaling " + config["rope_scaling"].dump() + " is not supported (only the default rope)";
  if (hf_config_string(config, "hidden_act", "silu", where) != "silu") return where + ": hidden_act must be \"silu\"";
  const bool tied = hf_config_bool(config, "tie_word_embeddings", false, where);
  if (tied != cfg.tie_embeddings)
    return where + std::string(": tie_word_embeddings is ") + (tied ? "true" : "false") + " but model.tie_embeddings is " +
           (cfg.tie_embeddings ? "true" : "false");
  return "";
}

std::string hf_llama_config_mismatch(const nlohmann::json& config, const LlamaConfig& cfg) {
  const std::string where = "config.json";
  const std::string type = hf_config_string(config, "model_type", "", where);
  if (type != "llama") return where + ": model_type is \"" + type + "\", model.arch is \"llama\"";
  if (std::string e = hf_llama_shared_mismatch(config, cfg, where); !e.empty()) return e;
  if (std::string e = hf_int_mismatch(config, {{"intermediate_size", cfg.intermediate_size, "model.intermediate_size"}}, where);
      !e.empty())
    return e;
  if (hf_config_bool(config, "attention_bias", false, where) || hf_config_bool(config, "mlp_bias", false, where))
    return where + ": attention_bias / mlp_bias are not supported";
  return "";
}

void export_hf_decoder(const std::string& path, const HfDecoderFile& file, const ParamSource& params, DType dtype,
                       const std::map<std::string, std::string>& extra_metadata) {
  const std::string who = "[export_hf] " + path + ": ";
  params.check(file.inventory, who, file.family);
  std::vector<NamedArray> tensors;  // names and shapes; the values stream in as the file is written
  for (const ParamSpec& p : file.inventory.params)
    tensors.push_back(NamedArray{file.name_in_file(p.name), file_shape(p, file.base), {}});
  for (const auto& [name, shape] : file.zero_tensors) tensors.push_back(NamedArray{name, shape, {}});
  auto values_of = [&](size_t i) {
    if (i >= file.inventory.params.size()) return std::vector<float>(static_cast<size_t>(shape_numel(tensors[i].shape)), 0.0f);
    std::vector<float> v = params(file.inventory.params[i]);
    v.resize(static_cast<size_t>(shape_numel(tensors[i].shape)));  // the file's vocabulary rows
    return v;
  };
  std::map<std::string, std::string> meta = extra_metadata;
  meta["format"] = "pt";  // what transformers requires of a from_pretrained file
  meta["mfsdp_layout"] = file.layout;
  const HfExportPaths out = hf_export_paths(path);
  if (!out.config.empty()) std::filesystem::create_directories(path);
  write_f32_safetensors(out.weights, tensors, dtype, meta, values_of);
  if (!out.config.empty()) write_hf_config(out.config, file.config);
}

namespace {

std::vector<float> read_checked(const HfCheckpoint& ck, const std::string& name, const std::vector<int64_t>& shape,
                                const std::string& who) {
  const TensorInfo& t = ck.info(name);
  if (t.shape != shape)
    throw std::runtime_error(who + name + ": expected shape " + shape_str(shape) + ", file has " + shape_str(t.shape));
  try {
    return ck.read_f32(name);
  } catch (const SafetensorsError& e) {
    throw std::runtime_error(who + name + ": " + e.what());
  }
}

}  // namespace

ParamReader open_hf_decoder(const std::string& path, const HfDecoderFile& file) {
  const auto ck = std::make_shared<const HfCheckpoint>(path);
  const std::string who = "[import_hf] " + path + ": ";
  if (!ck->config().is_null()) {
    std::string e;
    try {  // a field of the wrong type throws, naming it
      e = file.config_mismatch(ck->config());
    } catch (const std::runtime_error& x) {
      e = x.what();
    }
    if (!e.empty()) throw std::runtime_error(who + e);
  }
  std::set<std::string> used;
  std::map<std::string, std::vector<int64_t>> shapes;  // our name -> its shape in the file, each checked
  for (const ParamSpec& p : file.inventory.params) {
    const std::string name = file.name_in_file(p.name);
    if (!ck->contains(name))
      throw std::runtime_error(who + name + ": missing from the checkpoint" +
                               (name == "lm_head.weight" ? " (was it saved with tie_word_embeddings?)" : ""));
    const std::vector<int64_t> fs = file_shape(p, file.base);
    if (ck->info(name).shape != fs)
      throw std::runtime_error(who + name + ": expected shape " + shape_str(fs) + ", file has " + shape_str(ck->info(name).shape));
    shapes[p.name] = fs;
    used.insert(name);
  }
  for (const auto& [name, shape] : file.zero_tensors) {
    if (!ck->contains(name)) continue;
    for (float x : read_checked(*ck, name, shape, who))
      if (x != 0.0f)
        throw std::runtime_error(who + name + ": holds nonzero values, and the " + file.family +
                                 " model of this project has no such parameter (it is zero in our exports)");
    used.insert(name);
  }
  static const std::regex inv_freq(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  for (const std::string& name : ck->names()) {
    if (used.count(name) || std::regex_match(name, inv_freq) || (file.base.tie_embeddings && name == "lm_head.weight"))
      continue;
    throw std::runtime_error(who + name + ": not a parameter of this config" +
                             (name == "lm_head.weight" ? " (model.tie_embeddings is true)" : ""));
  }
  return [ck, shapes, who, rename = file.file_name](const ParamSpec& p) {
    const auto it = shapes.find(p.name);
    if (it == shapes.end()) throw std::runtime_error(who + p.name + ": not a parameter of this model");
    std::vector<float> v = read_checked(*ck, rename ? rename(p.name) : p.name, it->second, who);
    v.resize(static_cast<size_t>(p.numel()), 0.0f);  // padded vocabulary rows
    return v;
  };
}

NamedTensors import_hf_decoder(const std::string& path, const HfDecoderFile& file) {
  return read_all(file.inventory, open_hf_decoder(path, file));
}

namespace {

HfDecoderFile llama_file(const LlamaConfig& cfg) {
  HfDecoderFile f;
  f.inventory = llama_inventory(cfg);
  f.base = cfg;
  f.family = "Llama";
  f.layout = "hf-llama";
  f.config = hf_llama_config_json(cfg);
  f.config_mismatch = [cfg](const nlohmann::json& c) { return hf_llama_config_mismatch(c, cfg); };
  return f;
}

}  // namespace

void export_hf_llama(const std::string& path, const LlamaConfig& cfg, const ParamSource& params, DType dtype,
                     const std::map<std::string, std::string>& extra_metadata) {
  export_hf_decoder(path, llama_file(cfg), params, dtype, extra_metadata);
}

NamedTensors import_hf_llama(const std::string& path, const LlamaConfig& cfg) {
  return import_hf_decoder(path, llama_file(cfg));
}

ParamReader open_hf_llama(const std::string& path, const LlamaConfig& cfg) { return open_hf_decoder(path, llama_file(cfg)); }

}  // namespace mfsdp
