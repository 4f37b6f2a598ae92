// Llama export/import in Hugging Face's LlamaForCausalLM layout: a from_pretrained directory
// (model.safetensors + config.json) or one safetensors file (see hf_checkpoint.h for the paths).
//
// Mapping between our layout (models/llama_spec.h: llama_inventory) and the files: names are the
// same (HF's own), matrices are [fan_out, fan_in] on both sides; model.embed_tokens.weight and
// lm_head.weight have Vp = padded_vocab_size() rows in memory and vocab_size rows in the file
// (import pads with zeros).
#pragma once
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/hf_checkpoint.h"
#include "models/llama_spec.h"
#include "runtime/core/dtype.h"

namespace mfsdp {

/// The config.json fields every decoder of this project shares (Llama attention, SwiGLU, RMSNorm,
/// rope, f32): architectures [architecture], model_type, the widths and counts, silu, rms_norm_eps,
/// rope_theta, initializer_range, tie_word_embeddings; each family adds its own.
nlohmann::json hf_decoder_config_json(const LlamaConfig& cfg, const char* architecture, const char* model_type,
                                      int64_t intermediate_size);

/// config.json of Hugging Face's LlamaForCausalLM for `cfg` (hidden_act silu, no biases, default
/// rope, max_position_embeddings = seq_len, head_dim = n_embd / n_head).
nlohmann::json hf_llama_config_json(const LlamaConfig& cfg);

/// "" when a Llama config.json describes `cfg` (model_type llama; hidden_size, num_hidden_layers,
/// num_attention_heads, num_key_value_heads (absent: = heads), intermediate_size, vocab_size,
/// rms_norm_eps, rope_theta, tie_word_embeddings; silu, no attention/MLP bias, no rope_scaling),
/// else a message naming the first differing field and its model.* key, e.g.
/// "config.json: num_key_value_heads is 2 but model.n_kv_head is 4".
std::string hf_llama_config_mismatch(const nlohmann::json& config, const LlamaConfig& cfg);

/// The fields every Llama-attention family shares with config.json (num_hidden_layers,
/// num_attention_heads, num_key_value_heads (absent: = heads), hidden_size, vocab_size, head_dim,
/// rms_norm_eps, rope_theta, default rope, silu, tie_word_embeddings): "" when they agree, else
/// the first mismatch as hf_llama_config_mismatch words it. `where` prefixes the message.
std::string hf_llama_shared_mismatch(const nlohmann::json& config, const LlamaConfig& cfg, const std::string& where);

/// What a Hugging Face file of a Llama-attention family holds besides our parameters: the facts
/// export_hf_decoder and import_hf_decoder need (the Llama and MoE families fill it).
struct HfDecoderFile {
  ParamInventory inventory;  ///< our parameters, in the order written (named as in the file by name_in_file)
  LlamaConfig base;          ///< vocabulary rows (Vp in memory, vocab_size in the file) and head tying
  std::string family;        ///< in messages: "Llama", "Qwen2-MoE"
  std::string layout;        ///< the "mfsdp_layout" metadata value: "hf-llama", "hf-qwen2-moe"
  nlohmann::json config;     ///< config.json written beside a directory export
  /// Tensors the file's class has and our family holds at zero (Qwen2-MoE's q/k/v biases):
  /// export writes them as zeros, import accepts them only when every value is zero.
  std::vector<std::pair<std::string, std::vector<int64_t>>> zero_tensors;
  /// "" when a checkpoint's config.json describes this model, else the first mismatch.
  std::function<std::string(const nlohmann::json&)> config_mismatch;
  /// Our parameter's name -> its name in the file; unset: the same (Mixtral renames the MoE block).
  std::function<std::string(const std::string&)> file_name;
  std::string name_in_file(const std::string& ours) const { return file_name ? file_name(ours) : ours; }
};

/// Writes `params` (exactly the names of file.inventory with its element counts) to `path` as
/// F32 or BF16, then file.zero_tensors as zeros: a directory gets model.safetensors and
/// config.json, a path ending in ".safetensors" just that file. Metadata: "format": "pt",
/// "mfsdp_layout": file.layout plus `extra_metadata`. Errors as export_hf_llama.
void export_hf_decoder(const std::string& path, const HfDecoderFile& file, const ParamSource& params, DType dtype,
                       const std::map<std::string, std::string>& extra_metadata);

/// Reads `path` (as import_hf_llama) into file.inventory's names. A directory's config.json must
/// pass file.config_mismatch; rotary inv_freq buffers are ignored; file.zero_tensors must be all
/// zero when present. Throws std::runtime_error naming the path and the first mismatch.
NamedTensors import_hf_decoder(const std::string& path, const HfDecoderFile& file);
/// The same checks when opening (and file.zero_tensors read); the parameters are read when asked.
ParamReader open_hf_decoder(const std::string& path, const HfDecoderFile& file);

/// Writes `params` (exactly the names of llama_inventory(cfg) with the inventory's element counts)
/// to `path` as F32 or BF16: a directory gets model.safetensors and config.json, a path ending in
/// ".safetensors" just that file. Metadata: "format": "pt" (transformers refuses other
/// values), "mfsdp_layout": "hf-llama" plus `extra_metadata`.
/// Throws std::invalid_argument naming a missing/extra parameter or a wrong element count,
/// SafetensorsError / std::runtime_error on I/O failure.
void export_hf_llama(const std::string& path, const LlamaConfig& cfg, const ParamSource& params,
                     DType dtype = DType::f32, const std::map<std::string, std::string>& extra_metadata = {});

/// Reads a Llama checkpoint (a transformers save_pretrained directory, sharded or not, or a file or
/// directory from export_hf_llama; F32/BF16/F16) into our layout, vocabulary rows padded to Vp with
/// zeros. A directory's config.json must agree with `cfg`; rotary inv_freq buffers are ignored, and
/// lm_head.weight is ignored when the config ties the head. Throws std::runtime_error naming the
/// path and the first mismatch, e.g. "model.layers.0.self_attn.k_proj.weight: expected shape
/// [16, 64], file has [64, 64]".
NamedTensors import_hf_llama(const std::string& path, const LlamaConfig& cfg);
/// import_hf_llama's checks when opening; the parameters are read when the reader is asked.
ParamReader open_hf_llama(const std::string& path, const LlamaConfig& cfg);

}  // namespace mfsdp
