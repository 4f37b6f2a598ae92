// Model shapes for benchmarks and cluster projections: the GPT-2 family and Llama-shaped
// decoders, as data (a table of presets, or a JSON object), each giving a ParamInventory and the
// ModelProfile the cluster projection (planner/projection.h) reads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/gpt_spec.h"
#include "models/moe_spec.h"
#include "planner/param_spec.h"
#include "planner/projection.h"

namespace mfsdp {

/// The shape of a decoder-only transformer; enough to build its parameter inventory and count
/// its training FLOPs. `family` is "gpt2" (fused QKV [3C, C], GELU MLP [4C, C] / [C, 4C], biases,
/// learned positions, LayerNorm) or "llama" (q/o [C, C], k/v [n_kv_head*hd, C] with hd = C /
/// n_head, SwiGLU gate/up [I, C] and down [C, I], RMSNorm [C], no biases, untied head [V, C]) or
/// "qwen2_moe" (Llama attention, and per layer a router [E, C] with `num_experts` SwiGLU experts
/// of width `intermediate`, top `experts_per_tok`, and a shared expert of width
/// `shared_intermediate` when > 0: models/moe_spec.h's moe_inventory).
struct ModelShape {
  std::string name, family = "gpt2";
  int n_layer = 12, n_embd = 768, n_head = 12, n_kv_head = 12;
  int64_t intermediate = 3072;  ///< MLP hidden width (gpt2: 4C)
  int64_t vocab = 50257;        ///< gpt2: padded to a multiple of 64 in the inventory
  int seq_len = 1024;
  bool tie_embeddings = true;   ///< gpt2 only; llama heads are untied
  int num_experts = 0, experts_per_tok = 0;  ///< qwen2_moe only
  int64_t shared_intermediate = 0;           ///< qwen2_moe only; 0 = no shared expert

  /// The FSDP inventory (unit 0 embedding, 1..L blocks, L+1 head); gpt2 = models/gpt_spec.h's
  /// gpt_inventory. Throws std::invalid_argument on a bad shape (n_head not dividing C, ...).
  ParamInventory inventory() const;
  /// Parameter count of inventory().
  int64_t num_params() const;
  /// Training FLOPs per token, forward + backward: 6 * N_matmul + 12 * n_layer * n_embd * context
  /// (PaLM appendix B; N_matmul = matrices and the head, not lookups, norms or biases; for
  /// qwen2_moe the matrices one token multiplies: k of the experts).
  double flops_per_token(int context) const;
  /// The GPTConfig of a gpt2-family shape (n_layer, n_head, n_embd, seq_len, vocab,
  /// tie_embeddings), validated. Throws std::invalid_argument for a llama shape or a bad value.
  GPTConfig gpt_config() const;
  /// The LlamaConfig of a llama-family shape, validated (head untied). Throws
  /// std::invalid_argument for another family or a bad value.
  LlamaConfig llama_config() const;
  /// The MoeConfig of a qwen2_moe-family shape, validated (head untied, routed experts of width
  /// `intermediate`). Throws std::invalid_argument for another family or a bad value.
  MoeConfig moe_config() const;
  /// What the cluster projection needs (planner/projection.h): the inventory, the sizes and
  /// 6 * N_matmul, so that profile().flops_per_token(T) == flops_per_token(T).
  ModelProfile profile() const;
};

/// Preset names, e.g. "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "llama-7b", "llama-13b",
/// "llama3-8b", "llama-30b", "llama-65b", "llama3-70b", "qwen2-moe-100m", "qwen2-moe-a2.7b".
std::vector<std::string> model_preset_names();
/// The named preset, with n_layer replaced by `layers` when layers > 0. Throws
/// std::invalid_argument naming the preset and listing the known ones.
ModelShape model_preset(const std::string& name, int layers = 0);
/// A shape from JSON: {"name", "family", "n_layer", "n_embd", "n_head", "n_kv_head",
/// "intermediate", "vocab", "seq_len", "tie_embeddings", "num_experts", "experts_per_tok",
/// "shared_intermediate"}; missing keys take ModelShape's defaults
/// (for llama, n_kv_head defaults to n_head). Throws nlohmann::json errors on wrong types.
ModelShape model_shape_from_json(const nlohmann::json& j);
nlohmann::json to_json(const ModelShape& m);

}  // namespace mfsdp
