// What the sharding engine needs of a model: the contract a model family implements (GPT-2 in
// models/gpt.h, Llama in models/llama.h) so the engine never names a model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/param_spec.h"
#include "runtime/core/check.h"
#include "runtime/ops_moe.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// One micro-batch of this rank: tokens and targets, i32 [B, T] (any device; the engine checks
/// the ids against the model's vocabulary on the host and moves them to its own device).
struct MicroBatch {
  Tensor tokens, targets;
  /// embedding_index(tokens) (runtime/ops.h) on the tokens' device, or undefined. The engine
  /// builds it from the host tokens and uploads it with them, so the CUDA embedding backward
  /// makes no device->host copy; models pass it to embedding().
  Tensor embedding_index = Tensor();
};

/// Rows [first_row, first_row + rows) of parameter `param` along its dim 0 (for a 1-D parameter:
/// elements).
struct ParamRows {
  std::string param;
  int64_t first_row = 0, rows = 0;
};

/// One attention head as QK-Clip sees it (MuonClip, Kimi K2, arXiv 2507.20534, section 2.1): the
/// parameter rows that produce its queries and its keys (weights and biases). Multiplying all of
/// them by s multiplies every logit q.k of the head by s^2.
struct AttentionHead {
  std::vector<ParamRows> qk_rows;
};

/// A model split into FSDP units that run one after another: unit 0 reads the tokens, each later
/// unit reads the previous unit's output, and the last unit returns the loss. Parameters are not
/// owned by the model: the engine binds each name to a view of its unit buffers, and the unit
/// forwards read whatever is bound (so the engine decides what is resident and on which device).
class UnitModel {
 public:
  virtual ~UnitModel() = default;

  /// Unit names in forward order and every parameter (name, logical shape, role, unit) in the
  /// canonical order the planner and checkpoints use.
  virtual const ParamInventory& inventory() const = 0;

  /// The vocabulary size V: every token id and target of a batch must lie in [0, V).
  virtual int64_t vocab_size() const = 0;
  int num_units() const { return static_cast<int>(inventory().unit_names.size()); }

  /// Binds parameter `name` to `t` (a view whose shape equals the inventory's). Throws
  /// std::invalid_argument for unknown names or wrong shapes.
  virtual void bind(const std::string& name, const Tensor& t) = 0;

  /// The units whose parameters unit u reads, u first (a head tied to the embedding also needs
  /// unit 0). The engine gathers all of them before running u and keeps them until u's backward.
  virtual std::vector<int> units_needed_by(int u) const = 0;

  /// Runs unit u on `x`, the previous unit's output (undefined for u = 0, which reads
  /// batch.tokens). The last unit returns the scalar loss: the sum of token cross-entropies
  /// divided by `loss_divisor` (<= 0: by the token count, the mean); other units return
  /// activations. Records autograd history unless a NoGradGuard is active.
  virtual Tensor forward_unit(int u, const Tensor& x, const MicroBatch& batch, double loss_divisor) const = 0;

  /// The last unit's logits [B*T, Vp] for its input `x` (the previous unit's output) instead of
  /// the loss: what sampling reads.
  virtual Tensor head_logits(const Tensor& x) const = 0;

  /// Elements [first, first + count) of the initial value of parameter `spec` (its flattened logical
  /// tensor), `count` floats into `out`: a function of (seed, parameter name, element) only, so
  /// every rank computes the same values for any slice without building the whole tensor.
  virtual void init_param(const ParamSpec& spec, uint64_t seed, int64_t first, int64_t count, float* out) const = 0;

  // ---- attention heads: per-head Muon split and QK-Clip (models without attention keep the defaults) ----
  /// Rows per attention head in the model's split (qkv_blocks > 1) matrices, e.g. GPT's
  /// n_embd / n_head; 0 when the model has none (then optimizer.muon.split_heads is refused).
  virtual int64_t attention_head_dim() const { return 0; }
  /// Features per head of the model's attention (d), for the choice of the attention kernel
  /// (resolve); 0 when it has no attention. attention_head_dim() unless a model says otherwise.
  virtual int64_t attention_head_size() const { return attention_head_dim(); }
  /// Every attention head, in the order of take_attention_logit_maxima (empty: no QK-Clip).
  virtual std::vector<AttentionHead> attention_heads() const { return {}; }
  /// Turns on (or off) the recording, during forwards with grad mode on (training, not
  /// evaluation), of each head's largest pre-softmax logit.
  virtual void record_attention_logits(bool /*on*/) {}
  /// The largest logit of each head (attention_heads order) over the recorded forwards since the
  /// previous call, -inf for a head that did not run; then starts a new record.
  virtual std::vector<float> take_attention_logit_maxima() { return {}; }

  // ---- Mixture of Experts (models without routed experts keep the defaults) ----
  /// Routes expert rows through `exchange` to the owners `owner_of_expert[ParamSpec::expert]`
  /// (expert parallelism, runtime/ops_moe.h), or, with null, runs every expert from its bound
  /// parameters. The engine turns it on around its training steps and evaluations (every rank in
  /// lockstep) and off otherwise. Throws std::invalid_argument when a model without experts is
  /// asked to turn it on.
  virtual void set_expert_exchange(const ExpertExchange* exchange, const std::vector<int>& /*owner_of_expert*/) {
    check_arg(exchange == nullptr, "UnitModel", "expert parallelism needs a model with routed experts");
  }
  /// Takes part, without rows of its own, in what unit u's forward exchanges with the other
  /// ranks (an evaluation rank whose sequences ran out still serves its experts' owners' share).
  virtual void forward_unit_without_rows(int /*u*/) const {}
};

}  // namespace mfsdp
