// Consolidated model export/import in the Hugging Face GPT-2 layout: one safetensors file, or a
// from_pretrained directory (model.safetensors + config.json for GPT2LMHeadModel; see
// hf_checkpoint.h for how a path maps to files).
//
// Mapping between our layout (models/gpt_spec.h: gpt_inventory) and the file:
//   - names are the inventory names (wte.weight, wpe.weight, h.{i}.ln_1.weight, ...,
//     h.{i}.attn.c_attn.weight, ..., ln_f.weight, lm_head.weight when untied): without a prefix in a
//     single file, with GPT2LMHeadModel's "transformer." before every name but lm_head.weight in a
//     from_pretrained directory;
//   - the Linear matrices attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj are stored transposed, as
//     HF's Conv1D keeps them: ours [fan_out, fan_in] -> file [fan_in, fan_out];
//   - wte (and lm_head when untied) have Vp = padded_vocab_size() rows in memory and vocab_size rows
//     in the file (import pads the extra rows with zeros);
//   - everything else is copied as is.
// Metadata: "format": "pt" (transformers refuses other values), "mfsdp_layout": "hf-gpt2", and the GPTConfig as strings: n_layer, n_head, n_embd,
// seq_len, vocab_size, tie_embeddings ("true"/"false").
#pragma once
#include <map>
#include <string>
#include <vector>

#include "models/gpt_spec.h"
#include "models/hf_checkpoint.h"
#include "runtime/core/dtype.h"

namespace mfsdp {

/// config.json of Hugging Face's GPT2LMHeadModel for `cfg` (n_positions = seq_len, gelu_new,
/// layer_norm_epsilon 1e-5, tie_word_embeddings).
nlohmann::json hf_gpt2_config_json(const GPTConfig& cfg);

/// "" when a GPT-2 config.json describes `cfg` (model_type gpt2, n_layer, n_head, n_embd, vocab_size,
/// n_positions >= seq_len, tie_word_embeddings) and the maths models/gpt.cpp implements (n_inner
/// null or 4*n_embd; activation_function gelu_new, gelu_pytorch_tanh or gelu_fast, the tanh GELU;
/// layer_norm_epsilon 1e-5; scale_attn_weights true; scale_attn_by_inverse_layer_idx and
/// add_cross_attention false), else a message naming the first differing field (and the model.*
/// key where there is one), e.g. "config.json: n_head is 12 but model.n_head is 4",
/// "config.json: layer_norm_epsilon is 0.001 (only GPT-2's 1e-05 is implemented)". A field of the
/// wrong JSON type throws std::runtime_error naming it.
std::string hf_gpt2_config_mismatch(const nlohmann::json& config, const GPTConfig& cfg);

/// Writes `params` (exactly the names of gpt_inventory(cfg), each with the inventory's numel) to
/// `path` (hf_export_paths: a .safetensors file, or a directory that also gets config.json) in the
/// HF GPT-2 layout, as F32 or BF16 (round to nearest even). Extra metadata entries
/// are added to the header. Throws std::invalid_argument naming the first missing/extra parameter
/// or wrong element count, SafetensorsError on I/O failure.
void export_hf_gpt2(const std::string& path, const GPTConfig& cfg, const ParamSource& params,
                    DType dtype = DType::f32, const std::map<std::string, std::string>& extra_metadata = {});

/// Reads a file or directory written by export_hf_gpt2, or a transformers GPT-2 checkpoint (a
/// save_pretrained directory, sharded or not, with or without the "transformer." prefix;
/// F32/BF16/F16), into our layout, wte/lm_head padded to Vp rows with zeros, wpe cut to seq_len
/// rows when the checkpoint has more positions. A directory's config.json must agree with `cfg`
/// (hf_gpt2_config_mismatch). The names and shapes must match gpt_inventory(cfg); HF's attention-mask
/// buffers (h.{i}.attn.bias / h.{i}.attn.masked_bias that are not 1-D) are ignored.
/// Throws std::runtime_error naming the file and the first mismatch, in inventory order, e.g.
/// "h.1.mlp.c_fc.weight: expected shape [128, 512], file has [128, 256]".
NamedTensors import_hf_gpt2(const std::string& path, const GPTConfig& cfg);
/// The same checks when opening; the values are read per parameter when the reader is asked.
ParamReader open_hf_gpt2(const std::string& path, const GPTConfig& cfg);

/// The GPTConfig recorded in an exported file's metadata, or a directory's config.json. Throws std::runtime_error naming the
/// file and key when the metadata is missing or malformed.
GPTConfig read_hf_gpt2_config(const std::string& path);

/// True for the four Linear weights HF stores as Conv1D [in, out] (c_attn, attn.c_proj, c_fc, mlp.c_proj).
bool hf_gpt2_is_conv1d(const std::string& name);

}  // namespace mfsdp
