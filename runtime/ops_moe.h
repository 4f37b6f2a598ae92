// The Mixture-of-Experts feed-forward as one differentiable op (Qwen2-MoE / Mixtral style): a
// softmax router picks top-k SwiGLU experts per token, an optional shared expert runs on every
// token behind a sigmoid gate, and the router's auxiliary losses inject their gradients in the
// op's backward.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/tensor.h"

namespace mfsdp {

/// One SwiGLU feed-forward's weights (Llama, Qwen2-MoE and Mixtral experts): gate [I, C],
/// up [I, C], down [C, I]; out = down(silu(gate(x)) * up(x)) with y = x W^T for each projection.
/// All undefined: no such expert (an absent shared expert).
struct SwigluWeights {
  Tensor gate, up, down;
  bool defined() const { return gate.defined(); }
};

/// Expert parallelism: how the ranks of a group reach each other, for moe_feed_forward calls that
/// every rank makes together, in the same order (the engine's units run in lockstep). Made from a
/// Communicator by the engine (runtime/engine); the op sees only these two operations.
struct ExpertExchange {
  int rank = 0, world = 1;
  /// Every rank's `mine` (the same length on every rank), concatenated in rank order.
  std::function<std::vector<int64_t>(const std::vector<int64_t>& mine)> all_gather_counts;
  /// Communicator::all_to_all_v of f32 elements: send_counts[d] elements of `send` (back to back
  /// in rank order) to rank d, recv_counts[s] elements from rank s into `recv`.
  std::function<void(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                     const std::vector<int64_t>& recv_counts)>
      all_to_all;
};

/// The router's choices for moe_feed_forward.
struct MoeOptions {
  int64_t top_k = 2;            ///< experts per token (num_experts_per_tok)
  bool norm_topk_prob = false;  ///< divide the k chosen probabilities by their sum
  /// d(objective) / d(load-balancing loss) and d(objective) / d(z-loss): the backward adds these
  /// multiples of the two losses' gradients into the router's (a coefficient times the share of
  /// this call's tokens in the objective). 0: the loss adds nothing.
  double aux_loss_weight = 0;
  double z_loss_weight = 0;
  /// Expert parallelism (null: every expert's weights are here). With an exchange, expert e lives
  /// only on rank expert_owner[e]: each rank routes its tokens, sends each expert's rows to its
  /// owner (counts first, then the rows, in rank order), the owner runs the expert on every
  /// rank's rows, one GEMM per source rank as that rank would, and sends the outputs back; the
  /// backward sends the output gradients to the owners, which add each source rank's weight
  /// gradient into the expert's gradient in rank order (the additions the owner's gradient
  /// reduction makes) and return the input gradients. Bitwise equal to the gathered op at the
  /// same world size. `experts[e]` need only be defined where expert_owner[e] == exchange->rank.
  const ExpertExchange* exchange = nullptr;
  std::vector<int> expert_owner;
};

/// What a forward routed, for the losses' values and load statistics (not differentiable).
struct MoeRouting {
  double aux_loss = 0;  ///< load-balancing loss E * sum_e f_e P_e of this call's tokens
  double z_loss = 0;    ///< router z-loss mean_n logsumexp(logits_n)^2
  /// (token, slot) assignments per expert; they sum to tokens * top_k
  std::vector<int64_t> tokens_per_expert;
};

/// MoE feed-forward of x [..., C] (f32, CPU or CUDA) with router [E, C] (no bias), experts[e] SwiGLU
/// weights (each expert's own tensors; intermediate widths may differ only between the routed
/// experts and the shared one), `shared` (or undefined) and shared_gate [1, C] (defined with
/// `shared`). Returns [..., C]:
///   p_n = softmax(x_n W_router^T) over the E experts (f32, sums in f64);
///   top-k of p_n, ties to the lower expert index; weights w = the chosen p (divided by their sum
///   when norm_topk_prob);
///   y_n = sum over the chosen experts in ascending expert index of w_e * expert_e(x_n)
///         [+ sigmoid(x_n shared_gate^T) * shared(x_n)]  (the terms added in this order, from 0).
/// Dropless: every expert computes every token routed to it, its tokens gathered in token order
/// (one GEMM per projection per expert, the Kernels GEMM), so each output depends only on the
/// token's own bytes, the expert's token count, the device and the thread count. On CUDA the
/// router's logits [N, E] are copied to the host, which routes (the CPU's code, so the same logits
/// give the same choices) and sends the index lists back; the rest stays on the device.
/// Auxiliary losses (transformers' load_balancing_loss_func on one layer; Zoph et al. 2022):
///   aux = E * sum_e f_e P_e, f_e = (assignments to e) / tokens (so sum_e f_e = k), P_e = mean_n p_ne;
///   z   = mean_n (logsumexp_e logits_ne)^2.
/// Their gradients (f_e held constant, as transformers' one_hot is) are added into the router
/// logits' gradient scaled by opt.aux_loss_weight and opt.z_loss_weight. `routing`, when not null,
/// receives both values and the per-expert counts.
/// f32 matmuls only. Throws std::invalid_argument "[moe_feed_forward] ..." under bf16 matmuls, on
/// mismatched shapes or devices, for an exchange on CUDA tensors (expert parallelism stages its
/// rows on the host: CPU only) and for an exchange whose expert_owner has not E ranks in [0, world).
Tensor moe_feed_forward(const Tensor& x, const Tensor& router, const std::vector<SwigluWeights>& experts,
                        const SwigluWeights& shared, const Tensor& shared_gate, const MoeOptions& opt,
                        MoeRouting* routing = nullptr);

}  // namespace mfsdp
