// GPT-2 architecture description (no tensors): hyperparameters and the parameter inventory.
#pragma once
#include <cstdint>
#include <string>

#include "planner/param_spec.h"

namespace mfsdp {

/// GPT-2 hyperparameters. vocab_size is the tokenizer's vocabulary; the embedding and head are
/// padded to padded_vocab_size() rows (a multiple of 64), whose extra rows never receive probability.
/// GPT-2's LayerNorm epsilon: the one value models/gpt.cpp implements (config.json's
/// layer_norm_epsilon in an export; an import of any other value is refused).
inline constexpr double kGptLayerNormEps = 1e-5;

struct GPTConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int seq_len = 64;  // maximum context (rows of wpe)
  int vocab_size = 65;
  bool tie_embeddings = true;
  double init_std = 0.02;  // std of the normal initialisation (GPT-2: 0.02)

  int64_t padded_vocab_size() const { return (static_cast<int64_t>(vocab_size) + 63) / 64 * 64; }
  /// Throws std::invalid_argument naming the field when a value is out of range.
  void validate() const;
  /// Total parameter count (tied head counted once; padded vocabulary rows included).
  int64_t num_params() const;
  /// Training FLOPs per token for forward+backward: 6*N_matmul + 12*n_layer*n_embd*T_attn
  /// (PaLM appendix B; N_matmul excludes the position embedding; attention over `context` tokens).
  double flops_per_token(int context) const;
};

/// The GPT-2 parameters in the Hugging Face layout and forward order, with roles and units:
///   unit 0 "embedding":  wte.weight [Vp, C] (embedding), wpe.weight [T, C] (embedding)
///   unit 1+i "h.i":      ln_1.weight/bias [C] (norm/bias), attn.c_attn.weight [3C, C] (matrix,
///                        qkv_blocks=3), attn.c_attn.bias [3C], attn.c_proj.weight [C, C],
///                        attn.c_proj.bias [C], ln_2.weight/bias [C], mlp.c_fc.weight [4C, C],
///                        mlp.c_fc.bias [4C], mlp.c_proj.weight [C, 4C], mlp.c_proj.bias [C]
///   unit L+1 "head":     ln_f.weight/bias [C], lm_head.weight [Vp, C] (head; only when untied)
/// Matrices are [fan_out, fan_in] (Linear convention), not HF Conv1D's [in, out].
ParamInventory gpt_inventory(const GPTConfig& cfg);

/// The checks both families share: n_layer, n_head, n_embd, seq_len >= 1, n_head divides n_embd,
/// vocab_size >= 2. Throws std::invalid_argument naming the field ("model.n_embd: ...").
void validate_transformer_dims(int n_layer, int n_head, int n_embd, int seq_len, int vocab_size);

/// Elements of every parameter of `inv` (the parameter count of a model).
int64_t inventory_numel(const ParamInventory& inv);
/// Training FLOPs per token for forward+backward (PaLM appendix B): 6 * n_matmul (the parameters
/// that multiply activations) + 12 * n_layer * n_embd * context (attention scores and values).
double palm_flops_per_token(int64_t n_matmul, int n_layer, int n_embd, int context);

}  // namespace mfsdp
