// Mixture-of-Experts export/import in Hugging Face's Qwen2MoeForCausalLM layout (transformers'
// qwen2_moe) for a model with a shared expert, or MixtralForCausalLM (mixtral) for one without a
// shared expert and with renormalised top-k weights (hf_moe_layout_refusal in models/moe_spec.h
// says which configs have neither): a from_pretrained directory (model.safetensors + config.json)
// or one safetensors file (see hf_checkpoint.h for the paths).
//
// Mapping between our layout (models/moe_spec.h: moe_inventory) and the files: names are the same
// (HF's own), matrices are [fan_out, fan_in] on both sides; the embedding and head have Vp rows in
// memory and vocab_size rows in the file. Qwen2-MoE's attention has q/k/v biases that this family
// does not: exports write them as zeros, imports accept them only when zero. Every layer is
// sparse (decoder_sparse_step 1, no mlp_only_layers), and the class always has a shared expert, so
// the layout needs shared_expert_intermediate_size > 0. Mixtral: no attention biases, the MoE block
// named block_sparse_moe (gate = the router, experts.j.w1 / w3 / w2 = gate / up / down
// projections), intermediate_size = the experts' width, num_local_experts.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "models/hf_checkpoint.h"
#include "models/moe_spec.h"
#include "runtime/core/dtype.h"

namespace mfsdp {

/// (hf_moe_layout_refusal, which says whether a config has this layout, is in models/moe_spec.h.)

/// config.json of Qwen2MoeForCausalLM for `cfg` (silu, default rope, max_position_embeddings =
/// seq_len, every layer sparse, no sliding window, the router loss coefficient as
/// router_aux_loss_coef; intermediate_size, used only by dense layers, set to the shared expert's).
nlohmann::json hf_moe_config_json(const MoeConfig& cfg);
/// config.json of MixtralForCausalLM for `cfg` (silu, default rope, no sliding window).
nlohmann::json hf_mixtral_config_json(const MoeConfig& cfg);

/// "" when a config.json describes `cfg` in its layout (Mixtral: model_type mixtral, the Llama
/// fields, num_local_experts, num_experts_per_tok, intermediate_size, no sliding window; else
/// model_type qwen2_moe, the Llama fields of
/// hf_llama_shared_mismatch, num_experts, num_experts_per_tok, moe_intermediate_size,
/// shared_expert_intermediate_size, norm_topk_prob, decoder_sparse_step 1, no mlp_only_layers,
/// no sliding window), else a message naming the first differing field and its model.* key.
std::string hf_moe_config_mismatch(const nlohmann::json& config, const MoeConfig& cfg);

/// Writes `params` (exactly the names of moe_inventory(cfg)) as Qwen2MoeForCausalLM or
/// MixtralForCausalLM, F32 or BF16; metadata "mfsdp_layout": "hf-qwen2-moe" or "hf-mixtral". Throws std::invalid_argument for a model without the
/// layout (hf_moe_layout_refusal) or a missing/extra parameter, SafetensorsError /
/// std::runtime_error on I/O failure.
void export_hf_moe(const std::string& path, const MoeConfig& cfg, const ParamSource& params,
                   DType dtype = DType::f32, const std::map<std::string, std::string>& extra_metadata = {});

/// Reads a Qwen2-MoE or Mixtral checkpoint (as the config's layout; a save_pretrained directory, sharded or not, or an export of
/// export_hf_moe) into our layout. Throws std::runtime_error naming the path and the first
/// mismatch (config field, missing or unexpected tensor, shape, nonzero attention bias).
NamedTensors import_hf_moe(const std::string& path, const MoeConfig& cfg);
/// import_hf_moe's checks when opening; the parameters are read when the reader is asked.
ParamReader open_hf_moe(const std::string& path, const MoeConfig& cfg);

}  // namespace mfsdp
