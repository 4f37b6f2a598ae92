// Hugging Face checkpoint files, independent of the model family: reading a from_pretrained
// directory (config.json + model.safetensors, or shards listed by model.safetensors.index.json)
// or one .safetensors file, and the file names of an export.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "planner/param_spec.h"
#include "runtime/core/dtype.h"

namespace mfsdp {

/// Parameters by inventory name, each the full logical tensor in our layout (row-major f32).
using NamedTensors = std::map<std::string, std::vector<float>>;

/// One tensor to write: name, shape and f32 values (numel(shape) of them).
struct NamedArray {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

/// Writes `tensors` in order to one safetensors file as F32 or BF16 (round to nearest even),
/// with `metadata`. Throws SafetensorsError on I/O failure or a value count that does not match
/// its shape. Temporaries of `path` that an earlier writer abandoned (killed mid-export) are
/// removed first (remove_abandoned_temporaries: writer gone, untouched for 10 minutes).
void write_f32_safetensors(const std::string& path, const std::vector<NamedArray>& tensors, DType dtype,
                           const std::map<std::string, std::string>& metadata);

/// The same, one tensor at a time: `tensors` gives names and shapes (their values are not read)
/// and values_of(i) returns tensor i's f32 values when the file reaches it, in order, so an export
/// holds one tensor (plus its bf16 copy) at a time.
void write_f32_safetensors(const std::string& path, const std::vector<NamedArray>& tensors, DType dtype,
                           const std::map<std::string, std::string>& metadata,
                           const std::function<std::vector<float>(size_t)>& values_of);

/// One parameter's full value in our layout (row-major f32, vocabulary rows padded), read from an
/// opened and checked checkpoint only when asked (open_hf_gpt2, open_hf_llama, open_hf_moe), so a
/// rank reads only the parameters it stores, one at a time. Throws std::runtime_error naming the
/// file and the tensor when it cannot be read or `spec` is not one of the model's parameters.
using ParamReader = std::function<std::vector<float>(const ParamSpec& spec)>;
/// Every parameter of `inv` through `read`: the whole model in memory, for tests and tools.
NamedTensors read_all(const ParamInventory& inv, const ParamReader& read);

/// Where an export takes its full parameters (our layout, row-major f32) from: a map of full
/// tensors, or a function asked once per parameter in inventory order (the sharding engine, which
/// gathers one FSDP unit at a time, so no rank holds the whole model).
class ParamSource {
 public:
  using Fn = std::function<std::vector<float>(const ParamSpec& spec)>;
  ParamSource(const NamedTensors& params) : map_(&params) {}  // NOLINT: implicit, as the map it wraps
  explicit ParamSource(Fn fn) : fn_(std::move(fn)) {}
  /// A map must hold exactly the names of `inv` with its element counts (check_full_params:
  /// throws std::invalid_argument starting with `who`); a function is checked per tensor.
  void check(const ParamInventory& inv, const std::string& who, const std::string& family) const;
  /// The full value of `spec`. Throws std::invalid_argument when it has another element count.
  std::vector<float> operator()(const ParamSpec& spec) const;

 private:
  const NamedTensors* map_ = nullptr;
  Fn fn_;
};

/// Where an export goes. `path` ending in ".safetensors": that one file, no config.json (our
/// single-file layout, readable by model.init_from). Any other path is a directory in Hugging
/// Face's from_pretrained layout: <path>/model.safetensors and <path>/config.json.
struct HfExportPaths {
  std::string weights;
  std::string config;  ///< "" for a single-file export
};
HfExportPaths hf_export_paths(const std::string& path);

/// Whether the existing file `weights` is the weights file of an export of this project: a
/// safetensors file whose metadata names an export layout ("mfsdp_layout": "hf-gpt2", "hf-llama").
/// False for any other file, or one that cannot be read as safetensors.
bool is_export_weights(const std::string& weights);
/// Whether the existing file `config` is the config.json of an export of this project: the
/// canonical JSON write_hf_config writes of an object with "model_type", beside a `weights` file
/// that is_export_weights (an export is replaced only as a whole). Throws std::runtime_error
/// naming the file when it cannot be read.
bool is_export_config(const std::string& config, const std::string& weights);
/// The files of directory `dir`, besides model.safetensors, that a Hugging Face loader may take as
/// a model's weights: other `*.safetensors` files (the shards `model-0000i-of-0000n.safetensors`),
/// `*.safetensors.index.json`, and `pytorch_model*.bin` with its `.bin.index.json`. Names only,
/// sorted; empty when `dir` is no directory.
std::vector<std::string> hf_other_weight_files(const std::string& dir);

/// Writes `config` as pretty JSON to `path` (atomically: a temporary renamed into place; the
/// abandoned temporaries of `path` are removed first, as write_f32_safetensors does). Throws
/// std::runtime_error naming the file on I/O failure.
void write_hf_config(const std::string& path, const nlohmann::json& config);

/// A checkpoint opened for reading. `path` is either a directory holding config.json and
/// model.safetensors or model.safetensors.index.json (whose "weight_map" names each tensor's shard),
/// or a single .safetensors file (then config() is null). Throws std::runtime_error naming the path
/// when the directory has neither weights layout, config.json or the index is not valid JSON, a
/// shard is missing, or a tensor appears in two shards; SafetensorsError for a malformed file.
class HfCheckpoint {
 public:
  explicit HfCheckpoint(const std::string& path);
  const std::string& path() const { return path_; }
  /// config.json (null when reading a single file).
  const nlohmann::json& config() const { return config_; }
  /// Every tensor name, file by file (shards in the order the index first names them), each file
  /// in data-block order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// Header entry; throws SafetensorsError naming the tensor when absent.
  const TensorInfo& info(const std::string& name) const;
  /// Elements as f32 (F32 copied, BF16/F16 widened). Throws SafetensorsError for other dtypes.
  std::vector<float> read_f32(const std::string& name) const;
  /// The metadata of the single file (empty for a directory).
  std::map<std::string, std::string> metadata() const;

 private:
  const SafetensorsFile& file_of(const std::string& name) const;
  std::string path_;
  nlohmann::json config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
  bool directory_ = false;
};

/// One integer hyperparameter as config.json (`hf_key`) and our config (`ours`, key `our_key`) hold it.
struct HfIntField {
  const char* hf_key;
  int64_t ours;
  const char* our_key;
};
/// "" when every field of config.json equals ours (an absent field counts as -1), else
/// "<where>: <hf_key> is <v> but <our_key> is <ours>" for the first that differs.
std::string hf_int_mismatch(const nlohmann::json& config, const std::vector<HfIntField>& fields, const std::string& where);

/// Checks that `params` holds exactly the names of `inv`, each with the inventory's element
/// count. Throws std::invalid_argument starting with `who` and naming the first extra or missing
/// parameter or the wrong count ("<family>" names the inventory in the message).
void check_full_params(const ParamInventory& inv, const NamedTensors& params, const std::string& who,
                       const std::string& family);

/// The integer field `key` of a config.json, `fallback` when absent or null. Throws
/// std::runtime_error "<where>: <key>: expected an integer, got <value>" when it is not a JSON
/// integer in int64's range (runtime/core/json_fields.h).
int64_t hf_config_int(const nlohmann::json& config, const std::string& key, int64_t fallback, const std::string& where);
/// The number field `key`, `fallback` when absent or null (same errors).
double hf_config_num(const nlohmann::json& config, const std::string& key, double fallback, const std::string& where);
/// The boolean field `key`, `fallback` when absent or null (same errors).
bool hf_config_bool(const nlohmann::json& config, const std::string& key, bool fallback, const std::string& where);
/// The string field `key`, `fallback` when absent or null (same errors).
std::string hf_config_string(const nlohmann::json& config, const std::string& key, const std::string& fallback,
                             const std::string& where);

}  // namespace mfsdp
