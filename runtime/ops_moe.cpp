// The MoE feed-forward (ops_moe.h) with a hand-written backward: route on the host, gather each
// expert's tokens in token order, run its three GEMMs through the Kernels GEMM, and add the
// weighted outputs back per token in ascending expert order. Every loop that writes a shared row
// runs in a fixed order, so the bits depend only on the inputs and the GEMM's thread count.
#include "runtime/ops_moe.h"

#include <algorithm>
#include <cmath>
#include <memory>
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
};

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
  for (size_t e = 0; e < experts.size(); ++e) check_expert(experts[e], C, "expert " + std::to_string(e));
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

// Backward of one SwiGLU expert: adds the weights' gradients (when they require grad) and writes
// dxe [n, C] (overwritten) from the output gradient dye [n, C].
void swiglu_backward(Kernels& k, const Tensor& xe, const SwigluWeights& w, const ExpertActs& a, const Tensor& dye,
                     float* dxe) {
  const int64_t n = xe.size(0), C = xe.size(1), I = w.gate.size(0);
  const Tensor h = Tensor::empty({n, I}), dh = Tensor::empty({n, I});
  k.swiglu_forward(a.g.data_f32(), a.u.data_f32(), h.data_f32(), n * I);
  if (w.down.requires_grad())
    k.gemm(true, false, C, I, n, 1.0f, dye.data_f32(), h.data_f32(), 1.0f, grad_buffer(w.down).data_f32());
  k.gemm(false, false, n, I, C, 1.0f, dye.data_f32(), w.down.data_f32(), 0.0f, dh.data_f32());
  const Tensor dg = Tensor::zeros({n, I}), du = Tensor::zeros({n, I});
  k.swiglu_backward(a.g.data_f32(), a.u.data_f32(), dh.data_f32(), dg.data_f32(), du.data_f32(), n * I);
  if (w.gate.requires_grad())
    k.gemm(true, false, I, C, n, 1.0f, dg.data_f32(), xe.data_f32(), 1.0f, grad_buffer(w.gate).data_f32());
  if (w.up.requires_grad())
    k.gemm(true, false, I, C, n, 1.0f, du.data_f32(), xe.data_f32(), 1.0f, grad_buffer(w.up).data_f32());
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
  swiglu_backward(k, x2, s.shared, s.shared_acts, dys, dxs.data_f32());
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

// The routed experts' backward, ascending expert index: each expert's weights' gradients, its
// part of dx (added row by row) and the combine weights' gradient dw [N, K].
void experts_backward(Kernels& k, const MoeSaved& s, const float* dy, float* dx, std::vector<float>& dw) {
  const Routes& r = s.routes;
  std::vector<int64_t> slot_of(r.N * r.K);
  for (int64_t i = 0; i < r.N * r.K; ++i) slot_of[r.row_of[i]] = i;
  for (int64_t e = 0; e < r.E; ++e) {
    for (const Tensor* t : {&s.experts[e].gate, &s.experts[e].up, &s.experts[e].down})
      if (t->requires_grad()) grad_buffer(*t);  // an expert without tokens gets a zero gradient
    const int64_t begin = r.offset[e], n = r.offset[e + 1] - begin;
    if (n == 0) continue;
    const Tensor dye = Tensor::empty({n, r.C}), dxe = Tensor::empty({n, r.C});
    const float* ye = s.acts[e].y.data_f32();
    float* dye_p = dye.data_f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = slot_of[begin + i], tok = r.token[begin + i];
      const float w = r.weight[slot];
      double dot = 0;
      for (int64_t c = 0; c < r.C; ++c) {
        dye_p[i * r.C + c] = w * dy[tok * r.C + c];
        dot += static_cast<double>(dy[tok * r.C + c]) * ye[i * r.C + c];
      }
      dw[slot] = static_cast<float>(dot);
    }
    swiglu_backward(k, gather_rows(s.x.data_f32(), r, begin, n), s.experts[e], s.acts[e], dye, dxe.data_f32());
    const float* dxe_p = dxe.data_f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float* row = dx + r.token[begin + i] * r.C;
      for (int64_t c = 0; c < r.C; ++c) row[c] += dxe_p[i * r.C + c];
    }
  }
}

void moe_backward(const MoeSaved& s, const Tensor& dy) {
  Kernels& k = kernels(Device::CPU);
  const Routes& r = s.routes;
  const Tensor dx = Tensor::zeros(s.x.shape());
  std::vector<float> dw(r.N * r.K, 0.0f);
  experts_backward(k, s, dy.data_f32(), dx.data_f32(), dw);
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
  for (int64_t e = 0; e < r.E; ++e) {
    const int64_t n = r.offset[e + 1] - r.offset[e];
    if (n > 0) s->acts[e] = swiglu_forward(k, gather_rows(x.data_f32(), r, r.offset[e], n), experts[e]);
  }
  Tensor y = Tensor::empty(x.shape());
  combine(r, s->acts, y.data_f32());
  if (shared.defined()) shared_forward(k, *s, y.data_f32());
  if (routing != nullptr) fill_routing(r, *routing);
  std::vector<Tensor> inputs{x, router};
  for (const SwigluWeights& w : experts) inputs.insert(inputs.end(), {w.gate, w.up, w.down});
  if (shared.defined()) inputs.insert(inputs.end(), {shared.gate, shared.up, shared.down, shared_gate});
  const bool grad = grad_mode_enabled() &&
                    std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.requires_grad(); });
  if (grad) record(y, kOp, std::move(inputs), [s](const Tensor& dy) { moe_backward(*s, dy); });
  return y;
}

}  // namespace mfsdp
