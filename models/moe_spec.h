// Mixture-of-Experts architecture description (no tensors): hyperparameters and the parameter
// inventory of the Qwen2-MoE / Mixtral-style family (models/moe.h).
#pragma once
#include <cstdint>
#include <string>

#include "models/llama_spec.h"
#include "planner/param_spec.h"

namespace mfsdp {

/// Hyperparameters of a decoder with Llama attention and a Mixture-of-Experts feed-forward in
/// every layer (the fields of Hugging Face's Qwen2MoeConfig with decoder_sparse_step 1 and no
/// mlp_only_layers). The Llama fields describe the embedding, attention, norms and head;
/// intermediate_size (Llama's dense SwiGLU width) is not used.
struct MoeConfig : LlamaConfig {
  int num_experts = 8;                      ///< routed experts per layer (E)
  int num_experts_per_tok = 2;              ///< experts each token is routed to (k)
  int moe_intermediate_size = 128;          ///< each routed expert's SwiGLU width
  int shared_expert_intermediate_size = 0;  ///< the shared expert's SwiGLU width; 0 = no shared expert
  bool norm_topk_prob = false;              ///< renormalise the k routing weights to sum to 1
  double router_aux_loss_coef = 0.001;      ///< load-balancing loss coefficient (Qwen2-MoE's default)
  double router_z_loss_coef = 0.0;          ///< router z-loss coefficient (0 = off)
  bool router_on_muon = false;              ///< the routers get role matrix (Muon) instead of router (AdamW)

  /// Throws std::invalid_argument naming the field ("model.num_experts: ...") when a value is out of range.
  void validate() const;
  /// Total parameter count (every expert; tied head counted once; padded vocabulary rows included).
  int64_t num_params() const;
  /// Parameters one token uses: the total less the (E - k) routed experts it skips in each layer.
  int64_t num_active_params() const;
  /// Training FLOPs per token for forward+backward: 6*N_active_matmul + 12*n_layer*n_embd*context
  /// (PaLM appendix B over the matrices a token multiplies: attention, router, k routed experts,
  /// the shared expert and its gate, the head).
  double flops_per_token(int context) const;
};

/// The parameters in Hugging Face Qwen2MoeForCausalLM names and forward order, with roles and
/// units (C = n_embd, E = num_experts, Im = moe_intermediate_size, Is =
/// shared_expert_intermediate_size): unit 0 and the head unit as llama_inventory(); unit 1+i
/// "layers.i": layer i's attention half as llama_inventory(), then
///   mlp.gate.weight [E, C] (router; matrix when router_on_muon),
///   mlp.experts.j.gate_proj.weight [Im, C], up_proj.weight [Im, C], down_proj.weight [C, Im]
///     for j = 0..E-1 (matrix: each its own Muon matrix with its own owner; ParamSpec::expert
///     = i * E + j on all three, so expert parallelism keeps them on one owner),
///   when Is > 0: mlp.shared_expert.{gate,up}_proj.weight [Is, C], down_proj.weight [C, Is]
///     (matrix) and mlp.shared_expert_gate.weight [1, C] (router).
ParamInventory moe_inventory(const MoeConfig& cfg);

/// The Hugging Face layouts of this family (models/moe_hf.h): Qwen2-MoE when the model has a
/// shared expert (Qwen2MoeSparseMoeBlock always has one), else Mixtral when the top-k routing
/// weights are renormalised (MixtralSparseMoeBlock always renormalises). hf_moe_is_mixtral: the
/// second case. hf_moe_layout_refusal: "" when one of them fits, else why neither does, naming the
/// model.* keys. hf_moe_layout_name: "Qwen2-MoE" or "Mixtral".
bool hf_moe_is_mixtral(const MoeConfig& cfg);
std::string hf_moe_layout_refusal(const MoeConfig& cfg);
const char* hf_moe_layout_name(const MoeConfig& cfg);

}  // namespace mfsdp
