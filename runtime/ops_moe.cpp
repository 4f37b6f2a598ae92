// The MoE feed-forward (ops_moe.h) with a hand-written backward: route on the host, gather each
// expert's tokens in token order, run its three GEMMs through the Kernels GEMM, and add the
// weighted outputs back per token in ascending expert order. Every loop that writes a shared row
// runs in a fixed order, so the bits depend only on the inputs and the GEMM's thread count.
#include "runtime/ops_moe.h"

#include <algorithm>
#include <cmath>
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
  std::vector<ExpertActs> acts;  // per expert (undefined tensors for experts without tokens)
  ExpertActs shared_acts;
  std::vector<float> shared_gate_value;  // [N] sigmoid(x shared_gate^T)
  // Expert parallelism: rows every rank routed to every expert ([world][E]), and as an owner, per
  // own expert and source rank, the rows received and their activations.
  std::vector<int64_t> counts;
  std::vector<std::vector<std::pair<Tensor, ExpertActs>>> owned;  // [E][world]
};

bool owns(const MoeOptions& opt, int64_t e) {
  return opt.exchange == nullptr || opt.expert_owner[static_cast<size_t>(e)] == opt.exchange->rank;
}

void check_expert(const SwigluWeights& w, int64_t C, const std::string& what) {
  // messages are built only for a failing check (this runs for every expert on every call)
  for (const Tensor* t : {&w.gate, &w.up, &w.down})
    if (!(t->defined() && t->dtype() == DType::f32 && t->device() == Device::CPU && t->dim() == 2))
      check_arg(false, kOp,
                what + " weights must be f32 CPU matrices, got " + (t->defined() ? t->describe() : "undefined"));
  const int64_t I = w.gate.size(0);
  if (!(w.gate.size(1) == C && w.up.size(0) == I && w.up.size(1) == C && w.down.size(0) == C && w.down.size(1) == I))
    check_arg(false, kOp, what + ": gate " + w.gate.describe() + ", up " + w.up.describe() + ", down " +
                              w.down.describe() + " are not [I, C], [I, C], [C, I] for C = " + std::to_string(C));
}

void check_moe_args(const Tensor& x, const Tensor& router, const std::vector<SwigluWeights>& experts,
                    const SwigluWeights& shared, const Tensor& shared_gate, const MoeOptions& opt) {
  check_arg(x.defined() && x.dtype() == DType::f32 && x.device() == Device::CPU && x.dim() >= 1, kOp,
            "input must be an f32 CPU tensor [..., C] (CUDA: not implemented), got " +
                (x.defined() ? x.describe() : "undefined"));
  check_arg(matmul_dtype() == DType::f32, kOp, "bf16 matmuls are not implemented; use f32 matmuls");
  const int64_t C = x.size(-1);
  check_arg(router.defined() && router.dtype() == DType::f32 && router.device() == Device::CPU &&
                router.dim() == 2 && router.size(1) == C && router.size(0) == static_cast<int64_t>(experts.size()),
            kOp, "router must be f32 [E = " + std::to_string(experts.size()) + ", C = " + std::to_string(C) +
                     "] on the CPU, got " + (router.defined() ? router.describe() : "undefined"));
  check_arg(opt.top_k >= 1 && opt.top_k <= static_cast<int64_t>(experts.size()), kOp,
            "top_k " + std::to_string(opt.top_k) + " outside [1, " + std::to_string(experts.size()) + "]");
  if (opt.exchange != nullptr) {
    check_arg(opt.expert_owner.size() == experts.size(), kOp,
              "expert_owner names " + std::to_string(opt.expert_owner.size()) + " owners for " +
                  std::to_string(experts.size()) + " experts");
    for (int o : opt.expert_owner)
      check_arg(o >= 0 && o < opt.exchange->world, kOp, "expert owner " + std::to_string(o) + " outside the group");
  }
  for (size_t e = 0; e < experts.size(); ++e)
    if (owns(opt, static_cast<int64_t>(e))) check_expert(experts[e], C, "expert " + std::to_string(e));
  check_arg(shared.defined() == shared_gate.defined(), kOp, "the shared expert and its gate come together");
  if (!shared.defined()) return;
  check_expert(shared, C, "shared expert");
  check_arg(shared_gate.dtype() == DType::f32 && shared_gate.device() == Device::CPU && shared_gate.dim() == 2 &&
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
  std::vector<float> logits(r.N * r.E);
  if (r.N > 0) k.gemm(false, true, r.N, r.E, r.C, 1.0f, x.data_f32(), router.data_f32(), 0.0f, logits.data());
  softmax_rows(logits.data(), r);
  choose_experts(r, opt.norm_topk_prob);
  group_by_expert(r);
  return r;
}

// Rows [begin, begin + n) of the expert-major token list, gathered from src [N, C].
Tensor gather_rows(const float* src, const Routes& r, int64_t begin, int64_t n) {
  Tensor out = Tensor::empty({n, r.C});
  float* o = out.data_f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::copy_n(src + r.token[begin + i] * r.C, r.C, o + i * r.C);
  return out;
}

// One SwiGLU expert over rows xe [n, C].
ExpertActs swiglu_forward(Kernels& k, const Tensor& xe, const SwigluWeights& w) {
  const int64_t n = xe.size(0), C = xe.size(1), I = w.gate.size(0);
  ExpertActs a{Tensor::empty({n, I}), Tensor::empty({n, I}), Tensor::empty({n, C})};
  k.gemm(false, true, n, I, C, 1.0f, xe.data_f32(), w.gate.data_f32(), 0.0f, a.g.data_f32());
  k.gemm(false, true, n, I, C, 1.0f, xe.data_f32(), w.up.data_f32(), 0.0f, a.u.data_f32());
  const Tensor h = Tensor::empty({n, I});
  k.swiglu_forward(a.g.data_f32(), a.u.data_f32(), h.data_f32(), n * I);
  k.gemm(false, true, n, C, I, 1.0f, h.data_f32(), w.down.data_f32(), 0.0f, a.y.data_f32());
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

// Backward of one SwiGLU expert: adds the weights' gradients into `grads` and writes dxe [n, C]
// (overwritten) from the output gradient dye [n, C].
void swiglu_backward(Kernels& k, const Tensor& xe, const SwigluWeights& w, const ExpertActs& a, const Tensor& dye,
                     float* dxe, const SwigluGrads& grads) {
  const int64_t n = xe.size(0), C = xe.size(1), I = w.gate.size(0);
  const Tensor h = Tensor::empty({n, I}), dh = Tensor::empty({n, I});
  k.swiglu_forward(a.g.data_f32(), a.u.data_f32(), h.data_f32(), n * I);
  if (grads.down) k.gemm(true, false, C, I, n, 1.0f, dye.data_f32(), h.data_f32(), 1.0f, grads.down);
  k.gemm(false, false, n, I, C, 1.0f, dye.data_f32(), w.down.data_f32(), 0.0f, dh.data_f32());
  const Tensor dg = Tensor::zeros({n, I}), du = Tensor::zeros({n, I});
  k.swiglu_backward(a.g.data_f32(), a.u.data_f32(), dh.data_f32(), dg.data_f32(), du.data_f32(), n * I);
  if (grads.gate) k.gemm(true, false, I, C, n, 1.0f, dg.data_f32(), xe.data_f32(), 1.0f, grads.gate);
  if (grads.up) k.gemm(true, false, I, C, n, 1.0f, du.data_f32(), xe.data_f32(), 1.0f, grads.up);
  k.gemm(false, false, n, C, I, 1.0f, dg.data_f32(), w.gate.data_f32(), 0.0f, dxe);
  k.gemm(false, false, n, C, I, 1.0f, du.data_f32(), w.up.data_f32(), 1.0f, dxe);
}

// y[n] = sum over n's experts (ascending) of w * expert output, from zero.
void combine(const Routes& r, const std::vector<ExpertActs>& acts, float* y) {
  std::vector<const float*> outputs(r.E, nullptr);
  for (int64_t e = 0; e < r.E; ++e)
    if (acts[e].y.defined()) outputs[e] = acts[e].y.data_f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.N; ++n) {
    float* yn = y + n * r.C;
    std::fill(yn, yn + r.C, 0.0f);
    for (int64_t j = 0; j < r.K; ++j) {
      const int32_t e = r.expert[n * r.K + j];
      const float w = r.weight[n * r.K + j];
      const float* ye = outputs[e] + (r.row_of[n * r.K + j] - r.offset[e]) * r.C;
      for (int64_t c = 0; c < r.C; ++c) yn[c] += w * ye[c];
    }
  }
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

// The shared expert on every token and its sigmoid gate, added into y.
void shared_forward(Kernels& k, MoeSaved& s, float* y) {
  const Routes& r = s.routes;
  s.shared_acts = swiglu_forward(k, s.x.reshape({r.N, r.C}), s.shared);
  s.shared_gate_value.assign(r.N, 0.0f);
  if (r.N > 0)
    k.gemm(false, true, r.N, 1, r.C, 1.0f, s.x.data_f32(), s.shared_gate.data_f32(), 0.0f,
           s.shared_gate_value.data());
  const float* ys = s.shared_acts.y.data_f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.N; ++n) {
    const float g = 1.0f / (1.0f + std::exp(-s.shared_gate_value[n]));
    s.shared_gate_value[n] = g;
    for (int64_t c = 0; c < r.C; ++c) y[n * r.C + c] += g * ys[n * r.C + c];
  }
}

// Shared expert backward: its weights' and gate's gradients, and its part of dx (added).
void shared_backward(Kernels& k, const MoeSaved& s, const float* dy, float* dx) {
  const Routes& r = s.routes;
  const Tensor dys = Tensor::empty({r.N, r.C}), dxs = Tensor::empty({r.N, r.C});
  std::vector<float> dlogit(r.N);
  const float* ys = s.shared_acts.y.data_f32();
  float* dys_p = dys.data_f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < r.N; ++n) {
    const float g = s.shared_gate_value[n];
    double dot = 0;
    for (int64_t c = 0; c < r.C; ++c) {
      dys_p[n * r.C + c] = g * dy[n * r.C + c];
      dot += static_cast<double>(dy[n * r.C + c]) * ys[n * r.C + c];
    }
    dlogit[n] = static_cast<float>(dot) * g * (1.0f - g);
  }
  const Tensor x2 = s.x.reshape({r.N, r.C});
  swiglu_backward(k, x2, s.shared, s.shared_acts, dys, dxs.data_f32(), grad_buffers_of(s.shared));
  if (s.shared_gate.requires_grad())
    k.gemm(true, false, 1, r.C, r.N, 1.0f, dlogit.data(), s.x.data_f32(), 1.0f,
           grad_buffer(s.shared_gate).data_f32());
  k.add(dx, dx, dxs.data_f32(), r.N * r.C);
  k.gemm(false, false, r.N, r.C, 1, 1.0f, dlogit.data(), s.shared_gate.data_f32(), 1.0f, dx);
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
  if (s.router.requires_grad())
    k.gemm(true, false, r.E, r.C, r.N, 1.0f, dlogits.data(), s.x.data_f32(), 1.0f, grad_buffer(s.router).data_f32());
  k.gemm(false, false, r.N, r.C, r.E, 1.0f, dlogits.data(), s.router.data_f32(), 1.0f, dx);
}

// The output gradient of every expert row, w * dy[token] in expert-major row order [N K, C], and
// the combine weights' gradient dw [N, K] (dy[token] . the row's expert output).
Tensor expert_output_grads(const MoeSaved& s, const float* dy, std::vector<float>& dw) {
  const Routes& r = s.routes;
  std::vector<int64_t> slot_of(r.N * r.K);
  for (int64_t i = 0; i < r.N * r.K; ++i) slot_of[r.row_of[i]] = i;
  const Tensor dye = Tensor::empty({r.N * r.K, r.C});
  float* dye_p = dye.data_f32();
  for (int64_t e = 0; e < r.E; ++e) {
    const int64_t begin = r.offset[e], n = r.offset[e + 1] - begin;
    if (n == 0) continue;
    const float* ye = s.acts[e].y.data_f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = slot_of[begin + i], tok = r.token[begin + i];
      const float w = r.weight[slot];
      double dot = 0;
      for (int64_t c = 0; c < r.C; ++c) {
        dye_p[(begin + i) * r.C + c] = w * dy[tok * r.C + c];
        dot += static_cast<double>(dy[tok * r.C + c]) * ye[i * r.C + c];
      }
      dw[slot] = static_cast<float>(dot);
    }
  }
  return dye;
}

// dx[token] += each expert row's input gradient (dxe [N K, C], expert-major), ascending expert index.
void add_expert_input_grads(const Routes& r, const float* dxe, float* dx) {
  for (int64_t e = 0; e < r.E; ++e) {
    const int64_t begin = r.offset[e], n = r.offset[e + 1] - begin;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float* row = dx + r.token[begin + i] * r.C;
      const float* g = dxe + (begin + i) * r.C;
      for (int64_t c = 0; c < r.C; ++c) row[c] += g[c];
    }
  }
}

// The routed experts' backward with every expert here, ascending expert index: each expert's
// weights' gradients, its part of dx and the combine weights' gradient dw [N, K].
void experts_backward(Kernels& k, const MoeSaved& s, const float* dy, float* dx, std::vector<float>& dw) {
  const Routes& r = s.routes;
  const Tensor dye = expert_output_grads(s, dy, dw), dxe = Tensor::empty({r.N * r.K, r.C});
  for (int64_t e = 0; e < r.E; ++e) {
    const SwigluGrads grads = grad_buffers_of(s.experts[e]);  // an expert without tokens gets a zero gradient
    const int64_t begin = r.offset[e], n = r.offset[e + 1] - begin;
    if (n == 0) continue;
    swiglu_backward(k, gather_rows(s.x.data_f32(), r, begin, n), s.experts[e], s.acts[e],
                    dye.view(begin * r.C, {n, r.C}), dxe.data_f32() + begin * r.C, grads);
  }
  add_expert_input_grads(r, dxe.data_f32(), dx);
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
  const Tensor y = round_trip(s, gather_rows(s.x.data_f32(), r, 0, r.N * r.K),
                              [&](int64_t e, int src, const float* in, float* out, int64_t n) {
                                if (n == 0) return;
                                Tensor xe = rows_tensor(in, n, r.C);
                                ExpertActs a = swiglu_forward(k, xe, s.experts[e]);
                                std::copy_n(a.y.data_f32(), n * r.C, out);
                                if (grad_mode_enabled()) s.owned[e][src] = {std::move(xe), std::move(a)};
                              });
  for (int64_t e = 0; e < r.E; ++e)
    if (mine[e] > 0) s.acts[e].y = y.view(r.offset[e] * r.C, {mine[e], r.C});
}

// Backward of the routed experts under expert parallelism: the owners add each source rank's
// weight gradient into the expert's gradient, in rank order, and return the input gradients.
void experts_backward_parallel(Kernels& k, const MoeSaved& s, const float* dy, float* dx, std::vector<float>& dw) {
  const Routes& r = s.routes;
  const Tensor dye = expert_output_grads(s, dy, dw);
  // one zeroed gradient per weight and source, added like the owner's gradient reduction adds
  auto backward = [&](int64_t e, int src, const float* in, float* out, int64_t n) {
    const SwigluWeights& w = s.experts[e];
    const SwigluGrads into = grad_buffers_of(w);
    const Tensor tg = Tensor::zeros(w.gate.shape()), tu = Tensor::zeros(w.up.shape()), td = Tensor::zeros(w.down.shape());
    if (n > 0) {
      const auto& [xe, acts] = s.owned[e][src];
      swiglu_backward(k, xe, w, acts, rows_tensor(in, n, r.C), out, {tg.data_f32(), tu.data_f32(), td.data_f32()});
    }
    const std::pair<float*, const Tensor*> adds[] = {{into.gate, &tg}, {into.up, &tu}, {into.down, &td}};
    for (const auto& [g, t] : adds)
      if (g) k.add(g, g, t->data_f32(), t->numel());
  };
  const Tensor dxe = round_trip(s, dye, backward);
  add_expert_input_grads(r, dxe.data_f32(), dx);
}

void moe_backward(const MoeSaved& s, const Tensor& dy) {
  Kernels& k = kernels(Device::CPU);
  const Routes& r = s.routes;
  const Tensor dx = Tensor::zeros(s.x.shape());
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
  Kernels& k = kernels(Device::CPU);
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
    for (int64_t e = 0; e < r.E; ++e) {
      const int64_t n = r.offset[e + 1] - r.offset[e];
      if (n > 0) s->acts[e] = swiglu_forward(k, gather_rows(x.data_f32(), r, r.offset[e], n), experts[e]);
    }
  }
  Tensor y = Tensor::empty(x.shape());
  combine(r, s->acts, y.data_f32());
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
