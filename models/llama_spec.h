// Llama architecture description (no tensors): hyperparameters and the parameter inventory.
#pragma once
#include <cstdint>
#include <string>

#include "planner/param_spec.h"

namespace mfsdp {

/// Llama hyperparameters (Touvron et al. 2023; the fields of Hugging Face's LlamaConfig).
/// The embedding and untied head are padded to padded_vocab_size() rows (a multiple of 64), whose
/// extra rows never receive probability.
struct LlamaConfig {
  int n_layer = 4;                // num_hidden_layers
  int n_head = 4;                 // num_attention_heads
  int n_kv_head = 4;              // num_key_value_heads (grouped-query attention when < n_head)
  int n_embd = 128;               // hidden_size
  int intermediate_size = 344;    // SwiGLU width
  int seq_len = 64;               // maximum context (max_position_embeddings)
  int vocab_size = 65;
  bool tie_embeddings = false;    // tie_word_embeddings
  double init_std = 0.02;         // initializer_range
  double norm_eps = 1e-5;         // rms_norm_eps
  double rope_theta = 10000.0;    // rope_theta

  int head_dim() const { return n_embd / n_head; }
  int64_t padded_vocab_size() const { return (static_cast<int64_t>(vocab_size) + 63) / 64 * 64; }
  /// Throws std::invalid_argument naming the field ("model.n_kv_head: ...") when a value is out of range.
  void validate() const;
  /// Total parameter count (tied head counted once; padded vocabulary rows included).
  int64_t num_params() const;
  /// Training FLOPs per token for forward+backward: 6*N_matmul + 12*n_layer*n_embd*context
  /// (PaLM appendix B; N_matmul is every projection and the head, not the embedding lookup).
  double flops_per_token(int context) const;
};

/// The Llama parameters in Hugging Face LlamaForCausalLM names and forward order, with roles and
/// units (C = n_embd, d = head_dim, I = intermediate_size, Vp = padded vocabulary):
///   unit 0 "embedding":   model.embed_tokens.weight [Vp, C] (embedding)
///   unit 1+i "layers.i":  model.layers.i.input_layernorm.weight [C] (norm),
///                         self_attn.q_proj.weight [C, C], k_proj.weight [n_kv_head*d, C],
///                         v_proj.weight [n_kv_head*d, C], o_proj.weight [C, C] (matrix),
///                         post_attention_layernorm.weight [C] (norm),
///                         mlp.gate_proj.weight [I, C], mlp.up_proj.weight [I, C],
///                         mlp.down_proj.weight [C, I] (matrix)
///   unit L+1 "head":      model.norm.weight [C] (norm), lm_head.weight [Vp, C] (head; only when untied)
/// Matrices are [fan_out, fan_in] (Linear convention, as HF stores them). No biases.
ParamInventory llama_inventory(const LlamaConfig& cfg);

/// The parts of llama_inventory() a family with Llama attention shares (models/moe_spec.h):
/// unit 0 with the embedding, layer i's attention half (input_layernorm, self_attn.{q,k,v,o}_proj,
/// post_attention_layernorm, as listed above, into unit 1+i with the unit's name), and the head
/// unit. Each appends to `inv` in llama_inventory's order.
void append_llama_embedding(ParamInventory& inv, const LlamaConfig& cfg);
void append_llama_attention(ParamInventory& inv, const LlamaConfig& cfg, int layer);
void append_llama_head(ParamInventory& inv, const LlamaConfig& cfg);

}  // namespace mfsdp
