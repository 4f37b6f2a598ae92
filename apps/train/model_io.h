// The model family of a run as the trainer sees it: the UnitModel the engine trains plus what only
// the trainer needs (a description, FLOPs for MFU, import of model.init_from, export, sampling).
// Adding a family means one more implementation here; the engine and the loop stay as they are.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/train/train_config.h"
#include "models/hf_checkpoint.h"
#include "planner/memory_plan.h"
#include "runtime/engine/unit_model.h"

namespace mfsdp {

/// Full logical tensors by parameter name (our layout, row-major f32).
using TensorMap = std::map<std::string, std::vector<float>>;

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  /// The model the engine binds and runs.
  virtual UnitModel& units() = 0;
  /// The model's parameters (UnitModel::inventory).
  virtual const ParamInventory& inventory() const = 0;
  /// One line: family, depth, heads, width, context, vocabulary and parameter count.
  virtual std::string describe() const = 0;
  /// Training FLOPs per token (forward + backward) at the configured context, for MFU.
  virtual double flops_per_token() const = 0;
  virtual int64_t num_params() const = 0;
  /// The sizes the memory plan needs (planner/memory_plan.h): layers, width, heads, padded vocabulary.
  virtual MemoryModel memory_model() const = 0;
  /// Opens model.init_from (a Hugging Face checkpoint directory of the family, or one exported
  /// safetensors file), checks its names, shapes and config.json, and returns a reader of one
  /// parameter at a time. Throws std::runtime_error naming the path and the first mismatch with
  /// the config.
  virtual ParamReader open_weights(const std::string& path) const = 0;
  /// "" when model.init_from at `path` was made for this config as far as its recorded
  /// hyperparameters tell (what tensor shapes cannot, e.g. the head count), else why not.
  virtual std::string init_from_mismatch(const std::string& path) const = 0;
  /// Writes the full tensors in the family's Hugging Face layout, f32: a directory in
  /// from_pretrained layout (model.safetensors + config.json) or, for a path ending in
  /// ".safetensors", that one file (models/hf_checkpoint.h: hf_export_paths). `params` is asked
  /// for each parameter once, in inventory order (one tensor held at a time).
  virtual void export_weights(const std::string& path, const ParamSource& params,
                              const std::map<std::string, std::string>& metadata) const = 0;
  /// A one-token prompt when there is no validation text (GPT-2: <|endoftext|>).
  virtual int32_t start_token() const = 0;
  /// The name of the export layout, e.g. "Hugging Face GPT-2".
  virtual const char* export_layout() const = 0;
  /// Mixture-of-Experts models: this rank's (token, slot) assignments per layer and expert in the
  /// training forwards since the previous call ([layer][expert]), then a new count. Empty for
  /// models without experts (the same on every rank).
  virtual std::vector<std::vector<int64_t>> take_expert_counts() { return {}; }
};

/// The model of `cfg`: model.arch "gpt2" (models/gpt.h), "llama" (models/llama.h) or "qwen2_moe"
/// (models/moe.h). Throws
/// std::invalid_argument naming the model.* field when the architecture is invalid.
std::unique_ptr<TrainableModel> make_trainable_model(const TrainConfig& cfg);

}  // namespace mfsdp
