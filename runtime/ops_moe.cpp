// The MoE feed-forward (ops_moe.h) with a hand-written backward, on the CPU or CUDA: the router's
// logits come to the host, which routes (softmax, top-k, each expert's rows in token order) and
// sends the index lists back; the Kernels row kernels gather each expert's tokens, its three GEMMs
// run through the Kernels GEMM, and combine_rows adds the weighted outputs back per token in
// ascending expert order. Every kernel that writes a shared row does so in a fixed order, so the
// bits depend only on the inputs, the device and the GEMM's thread count.
#include "runtime/ops_moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>

#include "runtime/autograd.h"
#include "runtime/core/check.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"

namespace mfsdp {
namespace {

constexpr const char* kOp = "moe_feed_forward";

// One forward's routing: probabilities, choices and the per-expert token lists.
struct Routes {
  int64_t N = 0, C = 0, E = 0, K = 0;
  std::vector<float> probs;     // [N, E] softmax of the router logits
  std::vector<float> lse;       // [N] logsumexp of each token's logits
  std::vector<int32_t> expert;  // [N, K] each token's chosen experts, ascending
  std::vector<float> chosen;    // [N, K] their probabilities
  std::vector<float> weight;    // [N, K] their combine weights (normalised chosen when asked)
  std::vector<int64_t> offset;  // [E + 1] first expert row of each expert
  std::vector<int64_t> token;   // [N K] the token of each expert row (expert-major, token order)
  std::vector<int64_t> row_of;  // [N, K] the expert row of each (token, slot)
  // the same lists on the op's device, for the row kernels
  Tensor token_dev, row_of_dev;  // i32 [N K]
  Tensor weight_dev;             // f32 [N, K]
  Tensor row_weight_dev;         // f32 [N K] the combine weight of each expert row
};

// One SwiGLU expert's activations over its rows: gate and up pre-activations, and its output.
struct ExpertActs {
  Tensor g, u, y;
};

struct MoeSaved {
  Tensor x, router, shared_gate;
  std::vector<SwigluWeights> experts;
  SwigluWeights shared;
  MoeOptions opt;
  Routes routes;
  std::vector<ExpertActs> acts;  // per expert here (undefined for experts without tokens)
  Tensor expert_out;             // [N K, C] every expert row's output, expert-major
  ExpertActs shared_acts;
  Tensor shared_gate_value;  // [N] sigmoid(x shared_gate^T)
  // Expert parallelism: rows every rank routed to every expert ([world][E]), and as an owner, per
  // own expert and source rank, the rows received and their activations.
  std::vector<int64_t> counts;
  std::vector<std::vector<std::pair<Tensor, ExpertActs>>> owned;  // [E][world]
};

bool owns(const MoeOptions& opt, int64_t e) {
  return opt.exchange == nullptr || opt.expert_owner[static_cast<size_t>(e)] == opt.exchange->rank;
}

void check_expert(const SwigluWeights& w, int64_t C, Device dev, const std::string& what) {
  // messages are built only for a failing check (this runs for every expert on every call)
  for (const Tensor* t : {&w.gate, &w.up, &w.down})
    if (!(t->defined() && t->dtype() == DType::f32 && t->device() == dev && t->dim() == 2))
      check_arg(false, kOp,
                what + " weights must be f32 matrices on the input's device (" + device_name(dev) + "), got " +
                    (t->defined() ? t->describe() : "undefined"));
  const int64_t I = w.gate.size(0);
  if (!(w.gate.size(1) == C && w.up.size(0) == I && w.up.size(1) == C && w.down.size(0) == C && w.down.size(1) == I))
    check_arg(false, kOp, what + ": gate " + w.gate.describe() + ", up " + w.up.describe() + ", down " +
                              w.down.describe() + " are not [I, C], [I, C], [C, I] for C = " + std::to_string(C));
}

void check_moe_args(const Tensor& x, const Tensor& router, const std::vector<SwigluWeights>& experts,
                    const SwigluWeights& shared, const Tensor& shared_gate, const MoeOptions& opt) {
  check_arg(x.defined() && x.dtype() == DType::f32 && x.dim() >= 1, kOp,
            "input must be an f32 tensor [..., C], got " + (x.defined() ? x.describe() : "undefined"));
  check_arg(matmul_dtype() == DType::f32, kOp, "bf16 matmuls are not implemented; use f32 matmuls");
  const int64_t C = x.size(-1);
  const Device dev = x.device();
  check_arg(router.defined() && router.dtype() == DType::f32 && router.device() == dev && router.dim() == 2 &&
                router.size(1) == C && router.size(0) == static_cast<int64_t>(experts.size()),
            kOp, "router must be f32 [E = " + std::to_string(experts.size()) + ", C = " + std::to_string(C) +
                     "] on the input's device, got " + (router.defined() ? router.describe() : "undefined"));
  check_arg(opt.top_k >= 1 && opt.top_k <= static_cast<int64_t>(experts.size()), kOp,
            "top_k " + std::to_string(opt.top_k) + " outside [1, " + std::to_string(experts.size()) + "]");
  check_arg(C >= 1, kOp, "input has no features: " + x.describe());
  check_arg(x.numel() / C * opt.top_k <= std::numeric_limits<int32_t>::max(), kOp,
            "tokens x top_k exceeds the int32 row index range");
  if (opt.exchange != nullptr) {
    check_arg(dev == Device::CPU, kOp, "expert parallelism runs on the CPU only, got " + x.describe());
    check_arg(opt.expert_owner.size() == experts.size(), kOp,
              "expert_owner names " + std::to_string(opt.expert_owner.size()) + " owners for " +
                  std::to_string(experts.size()) + " experts");
    for (int o : opt.expert_owner)
      check_arg(o >= 0 && o < opt.exchange->world, kOp, "expert owner " + std::to_string(o) + " outside the group");
  }
  for (size_t e = 0; e < experts.size(); ++e)
    if (owns(opt, static_cast<int64_t>(e))) check_expert(experts[e], C, dev, "expert " + std::to_string(e));
  check_arg(shared.defined() == shared_gate.defined(), kOp, "the shared expert and its gate come together");
  if (!shared.defined()) return;
  check_expert(shared, C, dev, "shared expert");
  check_arg(shared_gate.dtype() == DType::f32 && shared_gate.device() == dev && shared_gate.dim() == 2 &&
                shared_gate.size(0) == 1 && shared_gate.size(1) == C,
            kOp, "shared expert gate must be f32 [1, " + std::to_string(C) + "], got " + shared_gate.describe());
}

// Softmax (f64 sum) and logsumexp of each row of logits [N, E].
void softmax_rows(const float* logits, Routes& r) {
  r.probs.assign(r.N * r.E, 0.0f);
  r.lse.assign(r.N, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.N; ++n) {
    const float* l = logits + n * r.E;
    const float mx = *std::max_element(l, l + r.E);
    double sum = 0;
    for (int64_t e = 0; e < r.E; ++e) sum += std::exp(static_cast<double>(l[e] - mx));
    for (int64_t e = 0; e < r.E; ++e)
      r.probs[n * r.E + e] = static_cast<float>(std::exp(static_cast<double>(l[e] - mx)) / sum);
    r.lse[n] = static_cast<float>(mx + std::log(sum));
  }
}

// Top-k of each row (largest probability first, ties to the lower index), the combine weights,
// then each token's choices sorted by expert index.
void choose_experts(Routes& r, bool norm_topk_prob) {
  r.expert.assign(r.N * r.K, 0);
  r.chosen.assign(r.N * r.K, 0.0f);
  r.weight.assign(r.N * r.K, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.N; ++n) {
    const float* p = r.probs.data() + n * r.E;
    int32_t* ex = r.expert.data() + n * r.K;
    std::vector<char> taken(r.E, 0);
    float sum = 0.0f;
    for (int64_t j = 0; j < r.K; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < r.E; ++e)
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      ex[j] = static_cast<int32_t>(best);
      sum += p[best];
    }
    std::sort(ex, ex + r.K);
    for (int64_t j = 0; j < r.K; ++j) {
      r.chosen[n * r.K + j] = p[ex[j]];
      r.weight[n * r.K + j] = norm_topk_prob ? p[ex[j]] / sum : p[ex[j]];
    }
  }
}

// Each expert's rows: the tokens routed to it in token order.
void group_by_expert(Routes& r) {
  r.offset.assign(r.E + 1, 0);
  for (int32_t e : r.expert) ++r.offset[e + 1];
  for (int64_t e = 0; e < r.E; ++e) r.offset[e + 1] += r.offset[e];
  std::vector<int64_t> next(r.offset.begin(), r.offset.end() - 1);
  r.token.assign(r.N * r.K, 0);
  r.row_of.assign(r.N * r.K, 0);
  for (int64_t n = 0; n < r.N; ++n)
    for (int64_t j = 0; j < r.K; ++j) {
      const int64_t row = next[r.expert[n * r.K + j]]++;
      r.token[row] = n;
      r.row_of[n * r.K + j] = row;
    }
}

Routes route(Kernels& k, const Tensor& x, const Tensor& router, const MoeOptions& opt) {
  Routes r;
  r.C = x.size(-1);
  r.N = x.numel() / r.C;
  r.E = router.size(0);
  r.K = opt.top_k;
  const Device dev = x.device();
  const Tensor logits = Tensor::empty({r.N, r.E}, DType::f32, dev);
  if (r.N > 0) k.gemm(false, true, r.N, r.E, r.C, 1.0f, x.data_f32(), router.data_f32(), 0.0f, logits.data_f32());
  softmax_rows(logits.to_vector().data(), r);
  choose_experts(r, opt.norm_topk_prob);
  group_by_expert(r);
  const int64_t R = r.N * r.K;
  std::vector<float> row_weight(R);
  for (int64_t i = 0; i < R; ++i) row_weight[r.row_of[i]] = r.weight[i];
  r.token_dev = tokens_tensor(std::vector<int32_t>(r.token.begin(), r.token.end()), {R}, dev);
  r.row_of_dev = tokens_tensor(std::vector<int32_t>(r.row_of.begin(), r.row_of.end()), {R}, dev);
  r.weight_dev = Tensor::from_vector(r.weight, {R}, dev);
  r.row_weight_dev = Tensor::from_vector(row_weight, {R}, dev);
  return r;
}

// Rows [begin, begin + n) of the expert-major token list, gathered from src [N, C].
Tensor gather_rows(Kernels& k, const Tensor& src, const Routes& r, int64_t begin, int64_t n) {
  Tensor out = Tensor::empty({n, r.C}, DType::f32, src.device());
  k.gather_rows(src.data_f32(), r.token_dev.data<int32_t>() + begin, out.data_f32(), n, r.C);
  return out;
}

// Where each routed expert's [n_e, I_e] block starts in a buffer shared by all routed experts of
// one call (n_e its rows, I_e its width). One buffer per quantity, viewed per expert, keeps a
// step's allocation sizes the same every step (the caching allocators reuse blocks by exact size)
// however the tokens are routed: each block starts on a 64-byte boundary (so a GEMM's operand
// alignment does not depend on the other experts' token counts) and the buffer holds the blocks
// plus E paddings of 16 elements.
struct ExpertBlocks {
  static constexpr int64_t kAlign = 16;  // f32 elements: 64 bytes
  std::vector<int64_t> at;               // [E + 1] element offsets
  int64_t capacity = 0;
  ExpertBlocks(const Routes& r, const std::vector<SwigluWeights>& experts) : at(r.E + 1, 0) {
    for (int64_t e = 0; e < r.E; ++e) {
      const int64_t n = r.offset[e + 1] - r.offset[e], numel = n > 0 ? n * experts[e].gate.size(0) : 0;
      capacity += numel + kAlign;
      at[e + 1] = at[e] + (numel + kAlign - 1) / kAlign * kAlign;
    }
  }
  Tensor buffer(Device dev, bool zeroed = false) const {
    return zeroed ? Tensor::zeros({capacity}, DType::f32, dev) : Tensor::empty({capacity}, DType::f32, dev);
  }
  Tensor of(const Tensor& buffer, int64_t e, int64_t n, int64_t width) const { return buffer.view(at[e], {n, width}); }
};

// One SwiGLU expert over rows xe [n, C] into a.g, a.u [n, I] and a.y [n, C]; h [n, I] is scratch.
void swiglu_forward(Kernels& k, const Tensor& xe, const SwigluWeights& w, const ExpertActs& a, const Tensor& h) {
  const int64_t n = xe.size(0), C = xe.size(1), I = w.gate.size(0);
  k.gemm(false, true, n, I, C, 1.0f, xe.data_f32(), w.gate.data_f32(), 0.0f, a.g.data_f32());
  k.gemm(false, true, n, I, C, 1.0f, xe.data_f32(), w.up.data_f32(), 0.0f, a.u.data_f32());
  k.swiglu_forward(a.g.data_f32(), a.u.data_f32(), h.data_f32(), n * I);
  k.gemm(false, true, n, C, I, 1.0f, h.data_f32(), w.down.data_f32(), 0.0f, a.y.data_f32());
}

// swiglu_forward into new buffers.
ExpertActs swiglu_forward(Kernels& k, const Tensor& xe, const SwigluWeights& w) {
  const int64_t n = xe.size(0), C = xe.size(1), I = w.gate.size(0);
  const Device dev = xe.device();
  const ExpertActs a{Tensor::empty({n, I}, DType::f32, dev), Tensor::empty({n, I}, DType::f32, dev),
                     Tensor::empty({n, C}, DType::f32, dev)};
  swiglu_forward(k, xe, w, a, Tensor::empty({n, I}, DType::f32, dev));
  return a;
}

// Where a SwiGLU expert's weight gradients go (added; null: not wanted).
struct SwigluGrads {
  float *gate = nullptr, *up = nullptr, *down = nullptr;
};

SwigluGrads grad_buffers_of(const SwigluWeights& w) {
  auto of = [](const Tensor& t) { return t.requires_grad() ? grad_buffer(t).data_f32() : nullptr; };
  return {of(w.gate), of(w.up), of(w.down)};
}

// Scratch of one SwiGLU expert's backward, each [n, I]; dg and du must hold zeros.
struct SwigluScratch {
  Tensor h, dh, dg, du;
};

SwigluScratch new_scratch(int64_t n, int64_t I, Device dev) {
  return {Tensor::empty({n, I}, DType::f32, dev), Tensor::empty({n, I}, DType::f32, dev),
          Tensor::zeros({n, I}, DType::f32, dev), Tensor::zeros({n, I}, DType::f32, dev)};
}

// Backward of one SwiGLU expert: adds the weights' gradients into `grads` and writes dxe [n, C]
// (overwritten) from the output gradient dye [n, C].
void swiglu_backward(Kernels& k, const Tensor& xe, const SwigluWeights& w, const ExpertActs& a, const Tensor& dye,
                     float* dxe, const SwigluGrads& grads, const SwigluScratch& t) {
  const int64_t n = xe.size(0), C = xe.size(1), I = w.gate.size(0);
  const Tensor &h = t.h, &dh = t.dh, &dg = t.dg, &du = t.du;
  k.swiglu_forward(a.g.data_f32(), a.u.data_f32(), h.data_f32(), n * I);
  if (grads.down) k.gemm(true, false, C, I, n, 1.0f, dye.data_f32(), h.data_f32(), 1.0f, grads.down);
  k.gemm(false, false, n, I, C, 1.0f, dye.data_f32(), w.down.data_f32(), 0.0f, dh.data_f32());
  k.swiglu_backward(a.g.data_f32(), a.u.data_f32(), dh.data_f32(), dg.data_f32(), du.data_f32(), n * I);
  if (grads.gate) k.gemm(true, false, I, C, n, 1.0f, dg.data_f32(), xe.data_f32(), 1.0f, grads.gate);
  if (grads.up) k.gemm(true, false, I, C, n, 1.0f, du.data_f32(), xe.data_f32(), 1.0f, grads.up);
  k.gemm(false, false, n, C, I, 1.0f, dg.data_f32(), w.gate.data_f32(), 0.0f, dxe);
  k.gemm(false, false, n, C, I, 1.0f, du.data_f32(), w.up.data_f32(), 1.0f, dxe);
}

// y[n] = sum over n's experts (ascending) of w * expert output, from zero.
void combine(Kernels& k, const MoeSaved& s, float* y) {
  const Routes& r = s.routes;
  k.combine_rows(s.expert_out.data_f32(), r.row_of_dev.data<int32_t>(), r.weight_dev.data_f32(), y, r.N, r.K, r.C,
                 false);
}

void fill_routing(const Routes& r, MoeRouting& out) {
  out.tokens_per_expert.assign(r.E, 0);
  for (int64_t e = 0; e < r.E; ++e) out.tokens_per_expert[e] = r.offset[e + 1] - r.offset[e];
  double aux = 0, z = 0;
  for (int64_t e = 0; e < r.E && r.N > 0; ++e) {
    double p = 0;
    for (int64_t n = 0; n < r.N; ++n) p += r.probs[n * r.E + e];
    aux += static_cast<double>(out.tokens_per_expert[e]) / r.N * (p / r.N);
  }
  for (int64_t n = 0; n < r.N; ++n) z += static_cast<double>(r.lse[n]) * r.lse[n];
  out.aux_loss = static_cast<double>(r.E) * aux;
  out.z_loss = r.N > 0 ? z / r.N : 0.0;
}

// Forward of the routed experts with every expert here: s.expert_out and each expert's activations
// (views of one buffer per quantity).
void experts_forward(Kernels& k, MoeSaved& s) {
  const Routes& r = s.routes;
  const Device dev = s.x.device();
  s.expert_out = Tensor::empty({r.N * r.K, r.C}, DType::f32, dev);
  const Tensor rows = gather_rows(k, s.x, r, 0, r.N * r.K);
  const ExpertBlocks blocks(r, s.experts);
  const Tensor g = blocks.buffer(dev), u = blocks.buffer(dev), h = blocks.buffer(dev);
  for (int64_t e = 0; e < r.E; ++e) {
    const int64_t begin = r.offset[e], n = r.offset[e + 1] - begin, I = s.experts[e].gate.size(0);
    if (n == 0) continue;
    s.acts[e] = {blocks.of(g, e, n, I), blocks.of(u, e, n, I), s.expert_out.view(begin * r.C, {n, r.C})};
    swiglu_forward(k, rows.view(begin * r.C, {n, r.C}), s.experts[e], s.acts[e], blocks.of(h, e, n, I));
  }
}

// The shared expert on every token and its sigmoid gate, added into y.
void shared_forward(Kernels& k, MoeSaved& s, float* y) {
  const Routes& r = s.routes;
  s.shared_acts = swiglu_forward(k, s.x.reshape({r.N, r.C}), s.shared);
  s.shared_gate_value = Tensor::empty({r.N}, DType::f32, s.x.device());
  if (r.N > 0)
    k.gemm(false, true, r.N, 1, r.C, 1.0f, s.x.data_f32(), s.shared_gate.data_f32(), 0.0f,
           s.shared_gate_value.data_f32());
  k.gated_add_rows(s.shared_acts.y.data_f32(), s.shared_gate_value.data_f32(), y, r.N, r.C);
}

// Shared expert backward: its weights' and gate's gradients, and its part of dx (added).
void shared_backward(Kernels& k, const MoeSaved& s, const float* dy, float* dx) {
  const Routes& r = s.routes;
  const Device dev = s.x.device();
  const Tensor dys = Tensor::empty({r.N, r.C}, DType::f32, dev), dxs = Tensor::empty({r.N, r.C}, DType::f32, dev);
  const Tensor dlogit_t = Tensor::empty({r.N}, DType::f32, dev);
  float* dlogit = dlogit_t.data_f32();
  k.gated_add_rows_backward(dy, s.shared_acts.y.data_f32(), s.shared_gate_value.data_f32(), dys.data_f32(), dlogit,
                            r.N, r.C);
  const Tensor x2 = s.x.reshape({r.N, r.C});
  swiglu_backward(k, x2, s.shared, s.shared_acts, dys, dxs.data_f32(), grad_buffers_of(s.shared),
                  new_scratch(r.N, s.shared.gate.size(0), dev));
  if (s.shared_gate.requires_grad())
    k.gemm(true, false, 1, r.C, r.N, 1.0f, dlogit, s.x.data_f32(), 1.0f,
           grad_buffer(s.shared_gate).data_f32());
  k.add(dx, dx, dxs.data_f32(), r.N * r.C);
  k.gemm(false, false, r.N, r.C, 1, 1.0f, dlogit, s.shared_gate.data_f32(), 1.0f, dx);
}

// Gradient of the router logits [N, E] from the combine weights' gradient dw [N, K] and the
// auxiliary losses; then the router weight's gradient and the router's part of dx (added).
void router_backward(Kernels& k, const MoeSaved& s, const std::vector<float>& dw, float* dx) {
  const Routes& r = s.routes;
  std::vector<float> dlogits(r.N * r.E);
  std::vector<double> f(r.E);
  for (int64_t e = 0; e < r.E; ++e) f[e] = static_cast<double>(r.offset[e + 1] - r.offset[e]) / r.N;
  const double aux_w = s.opt.aux_loss_weight, z_w = s.opt.z_loss_weight;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.N; ++n) {
    const float* p = r.probs.data() + n * r.E;
    std::vector<double> dp(r.E);
    for (int64_t e = 0; e < r.E; ++e) dp[e] = aux_w * r.E * f[e] / r.N;  // d aux / d p_ne
    double sum_w = 0, dot = 0;                                         // the top-k normalisation
    for (int64_t j = 0; j < r.K; ++j) {
      sum_w += r.chosen[n * r.K + j];
      dot += static_cast<double>(dw[n * r.K + j]) * r.weight[n * r.K + j];
    }
    for (int64_t j = 0; j < r.K; ++j) {
      const double g = dw[n * r.K + j];
      dp[r.expert[n * r.K + j]] += s.opt.norm_topk_prob ? (g - dot) / sum_w : g;
    }
    double pdp = 0;
    for (int64_t e = 0; e < r.E; ++e) pdp += p[e] * dp[e];
    for (int64_t e = 0; e < r.E; ++e)
      dlogits[n * r.E + e] = static_cast<float>(p[e] * (dp[e] - pdp) + z_w * 2.0 * r.lse[n] * p[e] / r.N);
  }
  const Tensor dl = Tensor::from_vector(dlogits, {r.N, r.E}, s.x.device());
  if (s.router.requires_grad())
    k.gemm(true, false, r.E, r.C, r.N, 1.0f, dl.data_f32(), s.x.data_f32(), 1.0f, grad_buffer(s.router).data_f32());
  k.gemm(false, false, r.N, r.C, r.E, 1.0f, dl.data_f32(), s.router.data_f32(), 1.0f, dx);
}

// The output gradient of every expert row, w * dy[token] in expert-major row order [N K, C], and
// the combine weights' gradient dw [N, K] (dy[token] . the row's expert output).
Tensor expert_output_grads(Kernels& k, const MoeSaved& s, const float* dy, std::vector<float>& dw) {
  const Routes& r = s.routes;
  const Device dev = s.x.device();
  const Tensor dye = Tensor::empty({r.N * r.K, r.C}, DType::f32, dev), dot = Tensor::empty({r.N * r.K}, DType::f32, dev);
  k.combine_rows_backward(dy, r.token_dev.data<int32_t>(), r.row_weight_dev.data_f32(), s.expert_out.data_f32(),
                          dye.data_f32(), dot.data_f32(), r.N * r.K, r.C);
  const std::vector<float> dot_of_row = dot.to_vector();
  for (int64_t i = 0; i < r.N * r.K; ++i) dw[i] = dot_of_row[r.row_of[i]];
  return dye;
}

// dx[token] += each expert row's input gradient (dxe [N K, C], expert-major), ascending expert index.
void add_expert_input_grads(Kernels& k, const Routes& r, const float* dxe, float* dx) {
  k.combine_rows(dxe, r.row_of_dev.data<int32_t>(), nullptr, dx, r.N, r.K, r.C, true);
}

// The routed experts' backward with every expert here, ascending expert index: each expert's
// weights' gradients, its part of dx and the combine weights' gradient dw [N, K].
void experts_backward(Kernels& k, const MoeSaved& s, const float* dy, float* dx, std::vector<float>& dw) {
  const Routes& r = s.routes;
  const Device dev = s.x.device();
  const Tensor dye = expert_output_grads(k, s, dy, dw), dxe = Tensor::empty({r.N * r.K, r.C}, DType::f32, dev);
  const Tensor rows = gather_rows(k, s.x, r, 0, r.N * r.K);
  const ExpertBlocks blocks(r, s.experts);
  const Tensor h = blocks.buffer(dev), dh = blocks.buffer(dev), dg = blocks.buffer(dev, true),
               du = blocks.buffer(dev, true);
  for (int64_t e = 0; e < r.E; ++e) {
    const SwigluGrads grads = grad_buffers_of(s.experts[e]);  // an expert without tokens gets a zero gradient
    const int64_t begin = r.offset[e], n = r.offset[e + 1] - begin, I = s.experts[e].gate.size(0);
    if (n == 0) continue;
    swiglu_backward(k, rows.view(begin * r.C, {n, r.C}), s.experts[e], s.acts[e], dye.view(begin * r.C, {n, r.C}),
                    dxe.data_f32() + begin * r.C, grads,
                    {blocks.of(h, e, n, I), blocks.of(dh, e, n, I), blocks.of(dg, e, n, I), blocks.of(du, e, n, I)});
  }
  add_expert_input_grads(k, r, dxe.data_f32(), dx);
}

// ---- expert parallelism: rows travel to their expert's owner and back ----

// Per destination rank, the elements of the expert-major rows [N K, C] whose expert it owns.
std::vector<int64_t> counts_by_owner(const MoeSaved& s) {
  const Routes& r = s.routes;
  std::vector<int64_t> c(static_cast<size_t>(s.opt.exchange->world), 0);
  for (int64_t e = 0; e < r.E; ++e) c[s.opt.expert_owner[e]] += (r.offset[e + 1] - r.offset[e]) * r.C;
  return c;
}

// Per source rank, the elements it sends this owner (its rows of the experts owned here).
std::vector<int64_t> counts_from_sources(const MoeSaved& s) {
  const Routes& r = s.routes;
  std::vector<int64_t> c(static_cast<size_t>(s.opt.exchange->world), 0);
  for (size_t src = 0; src < c.size(); ++src)
    for (int64_t e = 0; e < r.E; ++e)
      if (owns(s.opt, e)) c[src] += s.counts[src * r.E + e] * r.C;
  return c;
}

// Expert-major rows [N K, C] <-> the same rows grouped by owner (owner 0's experts ascending,
// then owner 1's, ...): `to_owners` packs rows into packed, else unpacks packed into rows.
void regroup_by_owner(const MoeSaved& s, float* rows, float* packed, bool to_owners) {
  const Routes& r = s.routes;
  int64_t at = 0;
  for (int d = 0; d < s.opt.exchange->world; ++d)
    for (int64_t e = 0; e < r.E; ++e) {
      if (s.opt.expert_owner[e] != d) continue;
      const int64_t len = (r.offset[e + 1] - r.offset[e]) * r.C;
      float* row = rows + r.offset[e] * r.C;
      if (to_owners) std::copy_n(row, len, packed + at);
      else std::copy_n(packed + at, len, row);
      at += len;
    }
}

// Sends expert-major rows [N K, C] to the owners, runs `owner_fn(e, src, in, out)` on every
// (own expert, source rank) block of n rows (in: [n, C] received, out: [n, C] returned) in
// source-major order, and returns what came back, expert-major.
template <class F>
Tensor round_trip(const MoeSaved& s, const Tensor& rows, F&& owner_fn) {
  const Routes& r = s.routes;
  const ExpertExchange& ex = *s.opt.exchange;
  const std::vector<int64_t> to_owner = counts_by_owner(s), from_src = counts_from_sources(s);
  std::vector<float> send(static_cast<size_t>(r.N * r.K * r.C));
  regroup_by_owner(s, rows.data_f32(), send.data(), true);
  std::vector<float> recv(static_cast<size_t>(std::accumulate(from_src.begin(), from_src.end(), int64_t{0})));
  ex.all_to_all(send.data(), to_owner, recv.data(), from_src);
  std::vector<float> back(recv.size());
  int64_t at = 0;
  for (int src = 0; src < ex.world; ++src)
    for (int64_t e = 0; e < r.E; ++e) {
      if (!owns(s.opt, e)) continue;
      const int64_t n = s.counts[src * r.E + e];
      owner_fn(e, src, recv.data() + at, back.data() + at, n);
      at += n * r.C;
    }
  ex.all_to_all(back.data(), from_src, send.data(), to_owner);
  const Tensor out = Tensor::empty({r.N * r.K, r.C});
  regroup_by_owner(s, out.data_f32(), send.data(), false);
  return out;
}

// Rows as their own [n, C] tensor (what the gathered op's GEMMs read).
Tensor rows_tensor(const float* p, int64_t n, int64_t C) {
  Tensor t = Tensor::empty({n, C});
  std::copy_n(p, n * C, t.data_f32());
  return t;
}

// Forward of the routed experts under expert parallelism: s.acts[e].y from the owners.
void experts_forward_parallel(Kernels& k, MoeSaved& s) {
  const Routes& r = s.routes;
  std::vector<int64_t> mine(r.E);
  for (int64_t e = 0; e < r.E; ++e) mine[e] = r.offset[e + 1] - r.offset[e];
  s.counts = s.opt.exchange->all_gather_counts(mine);
  s.owned.assign(r.E, std::vector<std::pair<Tensor, ExpertActs>>(s.opt.exchange->world));
  s.expert_out = round_trip(s, gather_rows(k, s.x, r, 0, r.N * r.K),
                              [&](int64_t e, int src, const float* in, float* out, int64_t n) {
                                if (n == 0) return;
                                Tensor xe = rows_tensor(in, n, r.C);
                                ExpertActs a = swiglu_forward(k, xe, s.experts[e]);
                                std::copy_n(a.y.data_f32(), n * r.C, out);
                                if (grad_mode_enabled()) s.owned[e][src] = {std::move(xe), std::move(a)};
                              });
}

// Backward of the routed experts under expert parallelism: the owners add each source rank's
// weight gradient into the expert's gradient, in rank order, and return the input gradients.
void experts_backward_parallel(Kernels& k, const MoeSaved& s, const float* dy, float* dx, std::vector<float>& dw) {
  const Routes& r = s.routes;
  const Tensor dye = expert_output_grads(k, s, dy, dw);
  // one zeroed gradient per weight and source, added like the owner's gradient reduction adds
  auto backward = [&](int64_t e, int src, const float* in, float* out, int64_t n) {
    const SwigluWeights& w = s.experts[e];
    const SwigluGrads into = grad_buffers_of(w);
    const Tensor tg = Tensor::zeros(w.gate.shape()), tu = Tensor::zeros(w.up.shape()), td = Tensor::zeros(w.down.shape());
    if (n > 0) {
      const auto& [xe, acts] = s.owned[e][src];
      swiglu_backward(k, xe, w, acts, rows_tensor(in, n, r.C), out, {tg.data_f32(), tu.data_f32(), td.data_f32()},
                      new_scratch(n, w.gate.size(0), Device::CPU));
    }
    const std::pair<float*, const Tensor*> adds[] = {{into.gate, &tg}, {into.up, &tu}, {into.down, &td}};
    for (const auto& [g, t] : adds)
      if (g) k.add(g, g, t->data_f32(), t->numel());
  };
  const Tensor dxe = round_trip(s, dye, backward);
  add_expert_input_grads(k, r, dxe.data_f32(), dx);
}

void moe_backward(const MoeSaved& s, const Tensor& dy) {
  Kernels& k = kernels(dy.device());
  const Routes& r = s.routes;
  const Tensor dx = Tensor::zeros(s.x.shape(), DType::f32, dy.device());
  std::vector<float> dw(r.N * r.K, 0.0f);
  if (s.opt.exchange) experts_backward_parallel(k, s, dy.data_f32(), dx.data_f32(), dw);
  else experts_backward(k, s, dy.data_f32(), dx.data_f32(), dw);
  if (s.shared.defined()) shared_backward(k, s, dy.data_f32(), dx.data_f32());
  router_backward(k, s, dw, dx.data_f32());
  accumulate_grad(s.x, dx);
}

}  // namespace

Tensor moe_feed_forward(const Tensor& x, const Tensor& router, const std::vector<SwigluWeights>& experts,
                        const SwigluWeights& shared, const Tensor& shared_gate, const MoeOptions& opt,
                        MoeRouting* routing) {
  check_moe_args(x, router, experts, shared, shared_gate, opt);
  Kernels& k = kernels(x.device());
  auto s = std::make_shared<MoeSaved>();
  s->x = x;
  s->router = router;
  s->shared_gate = shared_gate;
  s->experts = experts;
  s->shared = shared;
  s->opt = opt;
  s->routes = route(k, x, router, opt);
  const Routes& r = s->routes;
  s->acts.resize(r.E);
  if (opt.exchange) {
    experts_forward_parallel(k, *s);
  } else {
    experts_forward(k, *s);
  }
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  combine(k, *s, y.data_f32());
  if (shared.defined()) shared_forward(k, *s, y.data_f32());
  if (routing != nullptr) fill_routing(r, *routing);
  std::vector<Tensor> inputs{x, router};
  for (size_t e = 0; e < experts.size(); ++e)
    if (owns(opt, static_cast<int64_t>(e))) inputs.insert(inputs.end(), {experts[e].gate, experts[e].up, experts[e].down});
  if (shared.defined()) inputs.insert(inputs.end(), {shared.gate, shared.up, shared.down, shared_gate});
  const bool grad = grad_mode_enabled() &&
                    std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.requires_grad(); });
  if (grad) record(y, kOp, std::move(inputs), [s](const Tensor& dy) { moe_backward(*s, dy); });
  return y;
}

}  // namespace mfsdp
