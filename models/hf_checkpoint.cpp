#include "models/hf_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "runtime/core/check.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/json_fields.h"
#include "runtime/core/json_limits.h"

namespace mfsdp {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

json read_json(const fs::path& path) {
  const std::string text = read_input_file(path.string(), "", size_t{256} << 20);  // regular files only
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw std::runtime_error(path.string() + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels, refused");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    if (const size_t bad = invalid_utf8_at(text); bad != std::string::npos)
      throw std::runtime_error(path.string() + ": not valid UTF-8 (byte " + std::to_string(bad) + ")");
    throw std::runtime_error(path.string() + ": not valid JSON: " + json_error_text(e.what()));
  }
  if (!j.is_object())
    throw std::runtime_error(path.string() + ": a JSON " + std::string(j.type_name()) + ", not an object of the model's fields");
  return j;
}

}  // namespace

void write_f32_safetensors(const std::string& path, const std::vector<NamedArray>& tensors, DType dtype,
                           const std::map<std::string, std::string>& metadata) {
  write_f32_safetensors(path, tensors, dtype, metadata, [&](size_t i) { return tensors[i].values; });
}

void write_f32_safetensors(const std::string& path, const std::vector<NamedArray>& tensors, DType dtype,
                           const std::map<std::string, std::string>& metadata,
                           const std::function<std::vector<float>(size_t)>& values_of) {
  std::vector<TensorView> views;
  for (const NamedArray& t : tensors)
    views.push_back(TensorView{t.name, dtype == DType::bf16 ? "BF16" : "F32", t.shape, nullptr});
  std::vector<float> values;
  std::vector<uint16_t> bf16;
  remove_abandoned_temporaries(path);  // those of an earlier export killed while writing
  write_safetensors(path, views, metadata, [&](size_t i) -> const void* {
    values = values_of(i);
    int64_t n = 1;
    for (int64_t d : tensors[i].shape) n *= d;
    if (n != static_cast<int64_t>(values.size()))
      throw SafetensorsError(path + ": " + tensors[i].name + ": " + std::to_string(values.size()) +
                             " values for a shape of " + std::to_string(n) + " elements");
    if (dtype != DType::bf16) return values.data();
    bf16.resize(values.size());
    for (size_t k = 0; k < bf16.size(); ++k) bf16[k] = float_to_bf16(values[k]).bits;
    return bf16.data();
  });
}

NamedTensors read_all(const ParamInventory& inv, const ParamReader& read) {
  NamedTensors out;
  for (const ParamSpec& p : inv.params) out.emplace(p.name, read(p));
  return out;
}

void ParamSource::check(const ParamInventory& inv, const std::string& who, const std::string& family) const {
  if (map_) check_full_params(inv, *map_, who, family);
}

std::vector<float> ParamSource::operator()(const ParamSpec& spec) const {
  std::vector<float> v = map_ ? map_->at(spec.name) : fn_(spec);
  check_arg(static_cast<int64_t>(v.size()) == spec.numel(), "export",
            spec.name + ": " + std::to_string(v.size()) + " values, expected " + std::to_string(spec.numel()));
  return v;
}

HfExportPaths hf_export_paths(const std::string& path) {
  if (ends_with(path, ".safetensors")) return {path, ""};
  return {(fs::path(path) / "model.safetensors").string(), (fs::path(path) / "config.json").string()};
}

void write_hf_config(const std::string& path, const json& config) {
  remove_abandoned_temporaries(path);
  write_file_swap(path, config.dump(2) + "\n");
}

bool is_export_weights(const std::string& weights) {
  try {
    const SafetensorsFile f(weights);
    const auto it = f.metadata().find("mfsdp_layout");
    return it != f.metadata().end() && it->second.rfind("hf-", 0) == 0;
  } catch (const std::exception&) {
    return false;
  }
}

bool is_export_config(const std::string& config, const std::string& weights) {
  constexpr size_t kMaxRead = size_t{1} << 20;  // our config.json is a few hundred bytes
  const std::string text = read_input_file(config, "", kMaxRead, false);
  if (json_nesting_depth(text) > kMaxJsonDepth) return false;
  const json j = json::parse(text, nullptr, false);
  return j.is_object() && j.contains("model_type") && j.dump(2) + "\n" == text && is_export_weights(weights);
}

std::vector<std::string> hf_other_weight_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool safetensors = (ends_with(name, ".safetensors") && name != "model.safetensors") ||
                             ends_with(name, ".safetensors.index.json");
    const bool torch =
        name.rfind("pytorch_model", 0) == 0 && (ends_with(name, ".bin") || ends_with(name, ".bin.index.json"));
    if (name[0] != '.' && (safetensors || torch)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

HfCheckpoint::HfCheckpoint(const std::string& path) : path_(path) {
  const fs::path p(path);
  if (!fs::is_directory(p)) {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (const auto& n : files_[0]->names()) where_[n] = 0;
    return;
  }
  directory_ = true;
  const fs::path cfg = p / "config.json", single = p / "model.safetensors", index = p / "model.safetensors.index.json";
  if (!fs::exists(cfg)) throw std::runtime_error(path + ": no config.json (not a Hugging Face checkpoint directory)");
  require_input_file(cfg.string(), "");  // a FIFO or a device: refused by name (read_json would too)
  config_ = read_json(cfg);
  if (fs::exists(single)) {  // not a regular file: SafetensorsFile refuses it by name
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& n : files_[0]->names()) where_[n] = 0;
    return;
  }
  if (!fs::exists(index))
    throw std::runtime_error(path + ": neither model.safetensors nor model.safetensors.index.json");
  const json idx = read_json(index);
  if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
    throw std::runtime_error(index.string() + ": no \"weight_map\" object");
  std::map<std::string, size_t> shard_index;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw std::runtime_error(index.string() + ": weight_map[\"" + it.key() + "\"] is not a file name");
    const std::string shard = it.value().get<std::string>();
    if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
      throw std::runtime_error(index.string() + ": shard name '" + shard + "' must be a file in the directory");
    if (!shard_index.count(shard)) {
      if (!fs::is_regular_file(p / shard)) throw std::runtime_error(index.string() + ": shard " + shard + " is missing");
      shard_index[shard] = files_.size();
      files_.push_back(std::make_unique<SafetensorsFile>((p / shard).string()));
    }
  }
  for (const auto& [shard, i] : shard_index)
    for (const auto& n : files_[i]->names()) {
      if (where_.count(n)) throw std::runtime_error(path + ": tensor '" + n + "' appears in two shards");
      where_[n] = i;
    }
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& f : files_)
    for (const auto& n : f->names()) out.push_back(n);
  return out;
}

const SafetensorsFile& HfCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw SafetensorsError(path_ + ": no tensor '" + name + "'");
  return *files_[it->second];
}

const TensorInfo& HfCheckpoint::info(const std::string& name) const { return file_of(name).info(name); }

std::vector<float> HfCheckpoint::read_f32(const std::string& name) const { return file_of(name).read_f32(name); }

std::map<std::string, std::string> HfCheckpoint::metadata() const {
  return directory_ ? std::map<std::string, std::string>{} : files_[0]->metadata();
}

std::string hf_int_mismatch(const json& config, const std::vector<HfIntField>& fields, const std::string& where) {
  for (const HfIntField& f : fields) {
    const int64_t v = hf_config_int(config, f.hf_key, -1, where);
    if (v != f.ours)
      return where + ": " + f.hf_key + " is " + std::to_string(v) + " but " + f.our_key + " is " + std::to_string(f.ours);
  }
  return "";
}

void check_full_params(const ParamInventory& inv, const NamedTensors& params, const std::string& who,
                       const std::string& family) {
  std::map<std::string, int64_t> expected;
  for (const ParamSpec& p : inv.params) expected[p.name] = p.numel();
  for (const auto& [name, data] : params)
    if (!expected.count(name))
      throw std::invalid_argument(who + "parameter '" + name + "' is not in the " + family + " inventory");
  for (const ParamSpec& p : inv.params) {
    auto it = params.find(p.name);
    if (it == params.end()) throw std::invalid_argument(who + "missing parameter '" + p.name + "'");
    if (static_cast<int64_t>(it->second.size()) != p.numel()) {
      std::string shape = "[";
      for (size_t i = 0; i < p.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(p.shape[i]);
      throw std::invalid_argument(who + p.name + ": has " + std::to_string(it->second.size()) + " elements, shape " +
                                  shape + "] needs " + std::to_string(p.numel()));
    }
  }
}

namespace {

// config[key] when present and not null (then the caller's fallback applies).
std::optional<JsonFields<>::Field> hf_config_field(const json& config, const std::string& key, const JsonFields<>& f) {
  auto v = f.find(config, key);
  if (v && v->value().is_null()) return std::nullopt;
  return v;
}

}  // namespace

int64_t hf_config_int(const json& config, const std::string& key, int64_t fallback, const std::string& where) {
  const auto v = hf_config_field(config, key, JsonFields<>(where));
  return v ? v->integer() : fallback;
}

double hf_config_num(const json& config, const std::string& key, double fallback, const std::string& where) {
  const auto v = hf_config_field(config, key, JsonFields<>(where));
  return v ? v->number() : fallback;
}

bool hf_config_bool(const json& config, const std::string& key, bool fallback, const std::string& where) {
  const auto v = hf_config_field(config, key, JsonFields<>(where));
  return v ? v->boolean() : fallback;
}

std::string hf_config_string(const json& config, const std::string& key, const std::string& fallback,
                             const std::string& where) {
  const auto v = hf_config_field(config, key, JsonFields<>(where));
  return v ? v->string() : fallback;
}

}  // namespace mfsdp
