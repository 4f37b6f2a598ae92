// What the sharding engine needs of a model: the contract a model family implements (GPT-2 in
// models/gpt.h, Llama in models/llama.h) so the engine never names a model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/param_spec.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// One micro-batch of this rank: tokens and targets, i32 [B, T] (any device; the engine moves
/// them to its own).
struct MicroBatch {
  Tensor tokens, targets;
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

  /// The initial value of parameter `spec` (full logical tensor, spec.numel() floats into `out`),
  /// a function of (seed, parameter name) only, so every rank computes the same values.
  virtual void init_param(const ParamSpec& spec, uint64_t seed, float* out) const = 0;
};

}  // namespace mfsdp
