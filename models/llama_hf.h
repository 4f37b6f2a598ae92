// Llama export/import in Hugging Face's LlamaForCausalLM layout: a from_pretrained directory
// (model.safetensors + config.json) or one safetensors file (see hf_checkpoint.h for the paths).
//
// Mapping between our layout (models/llama_spec.h: llama_inventory) and the files: names are the
// same (HF's own), matrices are [fan_out, fan_in] on both sides; model.embed_tokens.weight and
// lm_head.weight have Vp = padded_vocab_size() rows in memory and vocab_size rows in the file
// (import pads with zeros).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "models/hf_checkpoint.h"
#include "models/llama_spec.h"
#include "runtime/core/dtype.h"

namespace mfsdp {

/// config.json of Hugging Face's LlamaForCausalLM for `cfg` (hidden_act silu, no biases, default
/// rope, max_position_embeddings = seq_len, head_dim = n_embd / n_head).
nlohmann::json hf_llama_config_json(const LlamaConfig& cfg);

/// "" when a Llama config.json describes `cfg` (model_type llama; hidden_size, num_hidden_layers,
/// num_attention_heads, num_key_value_heads (absent: = heads), intermediate_size, vocab_size,
/// rms_norm_eps, rope_theta, tie_word_embeddings; silu, no attention/MLP bias, no rope_scaling),
/// else a message naming the first differing field and its model.* key, e.g.
/// "config.json: num_key_value_heads is 2 but model.n_kv_head is 4".
std::string hf_llama_config_mismatch(const nlohmann::json& config, const LlamaConfig& cfg);

/// Writes `params` (exactly the names of llama_inventory(cfg) with the inventory's element counts)
/// to `path` as F32 or BF16: a directory gets model.safetensors and config.json, a path ending in
/// ".safetensors" just that file. Metadata: "format": "pt" (transformers refuses other
/// values), "mfsdp_layout": "hf-llama" plus `extra_metadata`.
/// Throws std::invalid_argument naming a missing/extra parameter or a wrong element count,
/// SafetensorsError / std::runtime_error on I/O failure.
void export_hf_llama(const std::string& path, const LlamaConfig& cfg, const NamedTensors& params,
                     DType dtype = DType::f32, const std::map<std::string, std::string>& extra_metadata = {});

/// Reads a Llama checkpoint (a transformers save_pretrained directory, sharded or not, or a file or
/// directory from export_hf_llama; F32/BF16/F16) into our layout, vocabulary rows padded to Vp with
/// zeros. A directory's config.json must agree with `cfg`; rotary inv_freq buffers are ignored, and
/// lm_head.weight is ignored when the config ties the head. Throws std::runtime_error naming the
/// path and the first mismatch, e.g. "model.layers.0.self_attn.k_proj.weight: expected shape
/// [16, 64], file has [64, 64]".
NamedTensors import_hf_llama(const std::string& path, const LlamaConfig& cfg);

}  // namespace mfsdp
