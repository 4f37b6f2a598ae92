// What the model families (GPT-2 in gpt.h, Llama in llama.h) share: parameters bound by name,
// deterministic per-name initialisation, and sampling from a logits function.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "planner/param_spec.h"
#include "runtime/tensor.h"

namespace mfsdp {

/// The tensors bound to a model's parameter names. Shapes come from the inventory; `owner` (e.g.
/// "GPT") prefixes error messages.
class BoundParams {
 public:
  BoundParams(const ParamInventory& inv, std::string owner);
  /// Binds `name` to `t`. Throws std::invalid_argument for an unknown name or a shape other than
  /// the inventory's.
  void bind(const std::string& name, const Tensor& t);
  /// The tensor bound to `name`. Throws std::invalid_argument when unknown, std::logic_error when unbound.
  const Tensor& get(const std::string& name) const;
  /// Allocates one flat f32 parameter buffer and one zeroed gradient buffer on `device`, fills the
  /// parameters with init(spec, out) on the host (spec.numel() floats each, inventory order), and
  /// binds views of them (parameters require grad; gradients are preallocated views).
  void allocate_local(const ParamInventory& inv, const std::function<void(const ParamSpec&, float*)>& init,
                      Device device);
  const Tensor& local_params() const { return local_params_; }
  const Tensor& local_grads() const { return local_grads_; }

 private:
  std::string owner_;
  std::map<std::string, Shape> shapes_;
  std::map<std::string, Tensor> params_;
  Tensor local_params_, local_grads_;
};

/// Fills out[0..count) with elements [first, first + count) of a parameter's N(0, std^2) draws
/// (Box-Muller, element 2p and 2p+1 from draws 2p and 2p+1) from a counter-based stream that
/// depends only on (seed, name): every rank computes the same values for any slice of a parameter,
/// without drawing the elements before it.
void normal_init(uint64_t seed, const std::string& name, double std, int64_t first, int64_t count, float* out);

/// Zeroes the elements at or after `from` of a slice holding elements [first, first + count) in
/// out[0..count) (padded vocabulary rows of an initialised slice).
void zero_from(int64_t from, int64_t first, int64_t count, float* out);

/// Samples `n` tokens after `prompt` (empty: token 0) with temperature and top-k (0 = all):
/// logits_of(tokens i32 [1, T]) returns logits [T, Vp] of which the first vocab_size columns are
/// used; the context is cut to the last seq_len tokens. Deterministic for a seed.
std::vector<int32_t> sample_from_logits(const std::function<Tensor(const Tensor&)>& logits_of, int seq_len,
                                        int vocab_size, std::vector<int32_t> prompt, int n, float temperature,
                                        int top_k, uint64_t seed);

}  // namespace mfsdp
