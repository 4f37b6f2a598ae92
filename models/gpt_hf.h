// Consolidated model export/import in the Hugging Face GPT-2 layout (one safetensors file).
//
// Mapping between our layout (models/gpt_spec.h: gpt_inventory) and the file:
//   - names are the inventory names (wte.weight, wpe.weight, h.{i}.ln_1.weight, ...,
//     h.{i}.attn.c_attn.weight, ..., ln_f.weight, lm_head.weight when untied), no "transformer." prefix;
//   - the Linear matrices attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj are stored transposed, as
//     HF's Conv1D keeps them: ours [fan_out, fan_in] -> file [fan_in, fan_out];
//   - wte (and lm_head when untied) have Vp = padded_vocab_size() rows in memory and vocab_size rows
//     in the file (import pads the extra rows with zeros);
//   - everything else is copied as is.
// Metadata: "format": "mfsdp-hf-gpt2", and the GPTConfig as strings: n_layer, n_head, n_embd,
// seq_len, vocab_size, tie_embeddings ("true"/"false").
#pragma once
#include <map>
#include <string>
#include <vector>

#include "runtime/core/dtype.h"
#include "models/gpt_spec.h"

namespace mfsdp {

/// Parameters by inventory name, each the full logical tensor in our layout (row-major f32).
using NamedTensors = std::map<std::string, std::vector<float>>;

/// Writes `params` (exactly the names of gpt_inventory(cfg), each with the inventory's numel) to
/// `path` in the HF GPT-2 layout, as F32 or BF16 (round to nearest even). Extra metadata entries
/// are added to the header. Throws std::invalid_argument naming the first missing/extra parameter
/// or wrong element count, SafetensorsError on I/O failure.
void export_hf_gpt2(const std::string& path, const GPTConfig& cfg, const NamedTensors& params,
                    DType dtype = DType::f32, const std::map<std::string, std::string>& extra_metadata = {});

/// Reads a file written by export_hf_gpt2 (or any HF GPT-2 safetensors file without the
/// "transformer." prefix, F32/BF16/F16) into our layout, wte/lm_head padded to Vp rows with zeros.
/// The names and shapes must match gpt_inventory(cfg); HF's attention-mask buffers
/// (h.{i}.attn.bias / h.{i}.attn.masked_bias of more than one dimension) are ignored.
/// Throws std::runtime_error naming the file and the first mismatch, in inventory order, e.g.
/// "h.1.mlp.c_fc.weight: expected shape [128, 512], file has [128, 256]".
NamedTensors import_hf_gpt2(const std::string& path, const GPTConfig& cfg);

/// The GPTConfig recorded in an exported file's metadata. Throws std::runtime_error naming the
/// file and key when the metadata is missing or malformed.
GPTConfig read_hf_gpt2_config(const std::string& path);

/// True for the four Linear weights HF stores as Conv1D [in, out] (c_attn, attn.c_proj, c_fc, mlp.c_proj).
bool hf_gpt2_is_conv1d(const std::string& name);

}  // namespace mfsdp
