// Per-op gradient checks against central finite differences (f32, eps chosen per op).
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>

#include "runtime/autograd.h"
#include "runtime/kernels.h"
#include "runtime/memory.h"
#include "runtime/ops.h"

using namespace mfsdp;

namespace {

Tensor randn(const Shape& s, std::mt19937& rng, float std = 1.0f) {
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(rng);
  return Tensor::from_vector(v, s);
}

double project(const Tensor& out, const std::vector<float>& r) {
  auto v = out.to_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<double>(v[i]) * r[i];
  return s;
}

// Checks d<out, R>/d(input) for every input against central differences on up to `samples`
// elements of each input. Relative error is normalised by the largest gradient magnitude.
void gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
               float eps, double tol, int samples = 40) {
  std::mt19937 rng(99);
  for (auto& t : inputs) t.set_requires_grad(true);
  Tensor out = f(inputs);
  std::vector<float> r(out.numel());
  std::normal_distribution<float> d;
  for (auto& x : r) x = d(rng);
  backward(out, Tensor::from_vector(r, out.shape()));
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    auto analytic = x.grad().to_vector();
    double scale = 1e-6;
    for (float g : analytic) scale = std::max(scale, static_cast<double>(std::fabs(g)));
    float* p = x.data_f32();
    std::uniform_int_distribution<int64_t> pick(0, x.numel() - 1);
    for (int s = 0; s < std::min<int64_t>(samples, x.numel()); ++s) {
      const int64_t i = x.numel() <= samples ? s : pick(rng);
      const float orig = p[i];
      double plus, minus;
      {
        NoGradGuard ng;
        p[i] = orig + eps;
        plus = project(f(inputs), r);
        p[i] = orig - eps;
        minus = project(f(inputs), r);
        p[i] = orig;
      }
      const double numeric = (plus - minus) / (2.0 * eps);
      INFO("input " << k << " element " << i << " analytic " << analytic[i] << " numeric " << numeric);
      CHECK(std::fabs(numeric - analytic[i]) / scale < tol);
    }
  }
}

}  // namespace

TEST_CASE("linear gradients match finite differences", "[gradcheck]") {
  std::mt19937 rng(1);
  gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
            {randn({2, 3, 5}, rng), randn({4, 5}, rng), randn({4}, rng)}, 1e-2f, 2e-3);
}

TEST_CASE("layer_norm gradients match finite differences", "[gradcheck]") {
  std::mt19937 rng(2);
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); },
            {randn({6, 8}, rng), randn({8}, rng), randn({8}, rng)}, 1e-2f, 5e-3);
}

TEST_CASE("gelu gradients match finite differences", "[gradcheck]") {
  std::mt19937 rng(3);
  gradcheck([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {randn({50}, rng, 2.0f)}, 1e-2f, 2e-3);
}

TEST_CASE("add (residual) gradients match finite differences", "[gradcheck]") {
  std::mt19937 rng(4);
  gradcheck([](const std::vector<Tensor>& in) { return add(in[0], in[1]); }, {randn({7}, rng), randn({7}, rng)},
            1e-2f, 1e-3);
}

TEST_CASE("embedding gradients match finite differences (repeated ids accumulate)", "[gradcheck]") {
  std::mt19937 rng(5);
  Tensor tok = tokens_tensor({1, 3, 1, 0, 2, 3}, {2, 3});
  gradcheck([tok](const std::vector<Tensor>& in) { return embedding(in[0], in[1], tok); },
            {randn({4, 5}, rng), randn({3, 5}, rng)}, 1e-2f, 1e-3);
}

TEST_CASE("causal self-attention gradients match finite differences", "[gradcheck]") {
  std::mt19937 rng(6);
  // B=2, T=5, C=8, 2 heads
  gradcheck([](const std::vector<Tensor>& in) { return causal_self_attention(in[0], 2); },
            {randn({2, 5, 24}, rng)}, 1e-2f, 5e-3, 60);
}

TEST_CASE("causal self-attention is causal: output t ignores inputs after t", "[ops]") {
  std::mt19937 rng(7);
  Tensor qkv = randn({1, 4, 12}, rng);
  Tensor y0 = causal_self_attention(qkv, 2);
  qkv.data_f32()[3 * 12 + 5] += 1.0f;  // perturb position 3
  Tensor y1 = causal_self_attention(qkv, 2);
  auto a = y0.to_vector(), b = y1.to_vector();
  for (int i = 0; i < 3 * 4; ++i) CHECK(a[i] == b[i]);  // positions 0..2 unchanged
}

TEST_CASE("cross-entropy over a padded vocabulary: gradients and padding", "[gradcheck]") {
  std::mt19937 rng(8);
  Tensor targets = tokens_tensor({0, 4, 2, 1}, {4});
  gradcheck([targets](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets, 5); },
            {randn({4, 8}, rng)}, 1e-2f, 2e-3);
  // Padding columns never receive probability: huge padded logits change nothing, get zero grad.
  Tensor logits = randn({4, 8}, rng);
  Tensor l0 = cross_entropy(logits, targets, 5);
  for (int n = 0; n < 4; ++n)
    for (int j = 5; j < 8; ++j) logits.data_f32()[n * 8 + j] = 1e4f;
  logits.set_requires_grad(true);
  Tensor l1 = cross_entropy(logits, targets, 5);
  CHECK(l1.item() == l0.item());
  backward(l1);
  auto g = logits.grad().to_vector();
  for (int n = 0; n < 4; ++n)
    for (int j = 5; j < 8; ++j) CHECK(g[n * 8 + j] == 0.0f);
  // closed form: uniform logits give log(V)
  Tensor flat = Tensor::zeros({3, 8});
  CHECK(cross_entropy(flat, tokens_tensor({0, 1, 2}, {3}), 5).item() == Approx(std::log(5.0)).epsilon(1e-6));
}

// ---- the fused classifier (classifier_loss) against linear + cross_entropy ----

namespace {

struct HeadGrads {
  float loss;
  std::vector<float> dh, dW;
};

// loss, dh, dW of one head on copies of h [N, C] and W [Vp, C]; chunk < 0 runs the unfused
// reference (linear, then cross_entropy). `upstream` is d(objective)/d(loss).
HeadGrads run_head(const Tensor& h0, const Tensor& W0, const Tensor& tgt, int64_t V, double divisor, int64_t chunk,
                   float upstream = 1.0f) {
  Tensor h = h0.clone(), W = W0.clone();
  h.set_requires_grad(true);
  W.set_requires_grad(true);
  Tensor loss = chunk < 0 ? cross_entropy(linear(h, W), tgt, V, divisor) : classifier_loss(h, W, tgt, V, divisor, chunk);
  backward(loss, Tensor::from_vector({upstream}, {1}));
  return {loss.item(), h.grad().to_vector(), W.grad().to_vector()};
}

// How far a chunked classifier may lie from the unfused one (f64 on the host). The two compute the
// same formulas on the same operands and differ only in the order of f32 sums inside GEMMs: a sum
// of K products has |error| <= gamma_K sum|products|, gamma_K = K u / (1 - K u), u = 2^-24
// (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), so two orders differ by 2 gamma_K.
// - logits (K = C): delta_n = 2 gamma_C max_j sum_k |h_nk W_jk| per row;
// - the row's loss moves by <= 2 delta_n (log-sum-exp and target logit), plus the f32 rounding of
//   each row loss and of the mean (2 u each);
// - the gradient s (p - onehot) moves by <= 2 s p_j delta_n (first order in the softmax), and under
//   bf16 matmuls its bf16 rounding may then flip by one bf16 ulp (at most 2^-7 |dl|);
// - dh (K = Vp) and dW (K = N): 2 gamma_K sum |dl| |other operand| plus the propagated input moves.
struct HeadBounds {
  double loss;
  std::vector<double> dh, dW;
};
HeadBounds head_bounds(const Tensor& h0, const Tensor& W0, const std::vector<int32_t>& tgt, int64_t V, double div,
                       bool bf16_matmuls) {
  const int64_t N = h0.size(0), C = h0.size(1), Vp = W0.size(0);
  auto round_in = [bf16_matmuls](std::vector<float> v) {
    if (bf16_matmuls)
      for (float& x : v) x = bf16_to_float(float_to_bf16(x));
    return v;
  };
  const std::vector<float> h = round_in(h0.to_vector()), W = round_in(W0.to_vector());
  const double u = std::ldexp(1.0, -24), s = 1.0 / div;
  auto gamma = [u](int64_t K) { return K * u / (1 - K * u); };
  HeadBounds b{0, std::vector<double>(N * C, 0.0), std::vector<double>(Vp * C, 0.0)};
  std::vector<double> mag(Vp * C, 0.0), moved(Vp * C, 0.0);
  double loss_sum = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> L(V), p(V);
    double amax = 0, mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < V; ++j) {
      double dot = 0, abs_dot = 0;
      for (int64_t k = 0; k < C; ++k) {
        dot += static_cast<double>(h[n * C + k]) * W[j * C + k];
        abs_dot += std::fabs(static_cast<double>(h[n * C + k]) * W[j * C + k]);
      }
      L[j] = dot;
      amax = std::max(amax, abs_dot);
      mx = std::max(mx, dot);
    }
    for (int64_t j = 0; j < V; ++j) z += std::exp(L[j] - mx);
    const double delta = 2 * gamma(C) * amax, row_loss = mx + std::log(z) - L[tgt[n]];
    loss_sum += row_loss;
    b.loss += 2 * delta + 2 * u * std::fabs(row_loss);
    for (int64_t j = 0; j < V; ++j) {
      p[j] = std::exp(L[j] - mx) / z;
      const double dl = std::fabs(s * (p[j] - (j == tgt[n] ? 1.0 : 0.0)));
      const double d = 2 * s * p[j] * delta + (bf16_matmuls ? std::ldexp(dl, -7) : 0.0);
      for (int64_t k = 0; k < C; ++k) {
        b.dh[n * C + k] += 2 * gamma(Vp) * (dl + d) * std::fabs(W[j * C + k]) + d * std::fabs(W[j * C + k]);
        mag[j * C + k] += (dl + d) * std::fabs(h[n * C + k]);
        moved[j * C + k] += d * std::fabs(h[n * C + k]);
      }
    }
  }
  for (int64_t i = 0; i < Vp * C; ++i) b.dW[i] = 2 * gamma(N) * mag[i] + moved[i];
  b.loss = b.loss * s + 2 * u * std::fabs(loss_sum * s);
  return b;
}

void check_within(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& bound) {
  REQUIRE(got.size() == ref.size());
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(static_cast<double>(got[i]) - ref[i]) <= bound[i])) ++bad;
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("fused classifier: one chunk is bitwise linear + cross_entropy; several chunks within a derived bound",
          "[ops][classifier]") {
  std::mt19937 rng(21);
  const int64_t N = 30, C = 16, Vp = 64, V = 61;
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 37 + 11) % V);
  const Tensor h = randn({N, C}, rng), W = randn({Vp, C}, rng, 0.5f), tgt = tokens_tensor(ids, {N});
  for (DType mm : {DType::f32, DType::bf16}) {
    MatmulDTypeScope scope(mm);
    INFO("matmuls in " << dtype_name(mm));
    for (double div : {0.0, 7.0}) {
      const HeadGrads ref = run_head(h, W, tgt, V, div, -1);
      // the default chunk (1048576 rows at Vp = 64) holds all N rows: the same GEMMs, the same bits
      const HeadGrads one = run_head(h, W, tgt, V, div, 0);
      CHECK(one.loss == ref.loss);
      CHECK(one.dh == ref.dh);
      CHECK(one.dW == ref.dW);
      // an upstream gradient other than 1 reruns the pass with that scale: still the same bits
      const HeadGrads half_ref = run_head(h, W, tgt, V, div, -1, 0.5f), half = run_head(h, W, tgt, V, div, 0, 0.5f);
      CHECK(half.dh == half_ref.dh);
      CHECK(half.dW == half_ref.dW);
      // chunks of 7 rows: 4 full chunks and a ragged one of 2
      const HeadGrads chunked = run_head(h, W, tgt, V, div, 7);
      const HeadBounds b = head_bounds(h, W, ids, V, div > 0 ? div : N, mm == DType::bf16);
      CHECK(std::fabs(static_cast<double>(chunked.loss) - ref.loss) <= b.loss);
      check_within(chunked.dh, ref.dh, b.dh);
      check_within(chunked.dW, ref.dW, b.dW);
      // padding rows of W get no gradient
      for (int64_t j = V; j < Vp; ++j)
        for (int64_t k = 0; k < C; ++k) CHECK(chunked.dW[j * C + k] == 0.0f);
    }
  }
  // evaluation (no grad) gives the training forward's loss
  const float trained = run_head(h, W, tgt, V, 0, 7).loss;
  NoGradGuard no_grad;
  CHECK(classifier_loss(h, W, tgt, V, 0, 7).item() == trained);
}

TEST_CASE("fused classifier gradients match finite differences (ragged chunks)", "[gradcheck][classifier]") {
  std::mt19937 rng(22);
  Tensor targets = tokens_tensor({0, 4, 2, 1, 3}, {5});
  gradcheck([targets](const std::vector<Tensor>& in) { return classifier_loss(in[0], in[1], targets, 5, 0, 2); },
            {randn({5, 3}, rng), randn({8, 3}, rng)}, 1e-2f, 2e-3);
}

TEST_CASE("fused classifier: chunk sizes, bad input, and memory below the N x Vp logits", "[ops][classifier]") {
  CHECK(classifier_chunk_rows(50304) == 1280);  // GPT-2: 1280 x 50304 x 4 B = 245.6 MiB <= 256 MiB
  CHECK(classifier_chunk_rows(128) == 524288);
  CHECK(classifier_chunk_rows(32000) == 2048);
  CHECK(classifier_chunk_rows(int64_t{1} << 22) == 64);  // the floor
  for (int64_t vp : {64, 128, 32000, 50304, 128256})
    CHECK(classifier_chunk_rows(vp) * vp * 4 <= (int64_t{256} << 20));
  CHECK_THROWS_WITH(classifier_loss(Tensor::zeros({2, 4}), Tensor::zeros({8, 3}), tokens_tensor({0, 1}, {2}), 8),
                    Catch::Contains("[classifier_loss]"));
  CHECK_THROWS_WITH(classifier_loss(Tensor::zeros({2, 4}), Tensor::zeros({8, 4}), tokens_tensor({0, 7}, {2}), 5),
                    Catch::Contains("target 7"));

  // N x Vp f32 logits would be 8192 x 65536 x 4 B = 2 GiB; the op holds one 1024-row chunk
  // (256 MiB), dW (2 MiB), dh (256 KiB) and the losses, and under bf16 matmuls the chunk's bf16
  // copy and the operands': classifier_bytes, the projection's head term, bounds the tracked peak.
  const int64_t N = 8192, C = 8, Vp = 65536, V = 65000;
  std::mt19937 rng(23);
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 7919) % V);
  const Tensor h0 = randn({N, C}, rng), W0 = randn({Vp, C}, rng, 0.1f), tgt = tokens_tensor(ids, {N});
  for (DType matmuls : {DType::f32, DType::bf16}) {
    INFO("matmuls in " << dtype_name(matmuls));
    MatmulDTypeScope scope(matmuls);
    Tensor h = h0.clone(), W = W0.clone();
    h.set_requires_grad(true);
    W.set_requires_grad(true);
    MemoryTracker& mt = MemoryTracker::instance();
    const int64_t before = mt.current_total(Device::CPU);
    mt.reset_peaks();
    Tensor loss = classifier_loss(h, W, tgt, V);
    backward(loss);
    const int64_t peak = mt.peak_total(Device::CPU) - before, logits_bytes = N * Vp * 4;
    const double bound = classifier_bytes(N, Vp, C, matmuls == DType::bf16);
    INFO("peak " << peak << " bytes; the N x Vp logits: " << logits_bytes << "; classifier_bytes: " << bound);
    CHECK(peak <= bound + 4096);
    CHECK(peak > classifier_bytes(N, Vp, C, false) * (matmuls == DType::bf16 ? 1.25 : 0.9));  // the chunk copy is live
    CHECK(peak * 5 < logits_bytes);
    CHECK(std::isfinite(loss.item()));
    CHECK(loss.item() > std::log(static_cast<double>(V)) - 1);  // near-uniform predictions: about log V
  }
}

// ---- Llama ops ----

TEST_CASE("token embedding without positions: gradients and values", "[gradcheck]") {
  std::mt19937 rng(9);
  Tensor tok = tokens_tensor({1, 3, 1, 0, 2, 3}, {2, 3});
  gradcheck([tok](const std::vector<Tensor>& in) { return embedding(in[0], Tensor(), tok); }, {randn({4, 5}, rng)},
            1e-2f, 1e-3);
  Tensor wte = randn({4, 5}, rng);
  auto y = embedding(wte, Tensor(), tok).to_vector();
  auto w = wte.to_vector();
  for (int c = 0; c < 5; ++c) CHECK(y[1 * 5 + c] == w[3 * 5 + c]);  // position 1 holds token 3
}

TEST_CASE("embedding_index: positions grouped by id, ids ascending, positions in order", "[embedding]") {
  // ids [3, 1, 3, 0, 1]: groups 0 -> {3}, 1 -> {1, 4}, 3 -> {0, 2}
  const Tensor idx = embedding_index(tokens_tensor({3, 1, 3, 0, 1}, {1, 5}));
  REQUIRE(idx.numel() == 2 * 3 + 1 + 5);
  const int32_t* p = idx.data<int32_t>();
  CHECK(std::vector<int32_t>(p, p + idx.numel()) == std::vector<int32_t>{0, 1, 3, 0, 1, 3, 5, 3, 1, 4, 0, 2});
  CHECK_FALSE(embedding_index(tokens_tensor({}, {0, 4})).defined());
  CHECK_THROWS_AS(embedding_index(Tensor::zeros({2})), std::invalid_argument);  // f32, not ids
  // an explicit index gives the same gradient bits as none on the CPU (which ignores it)
  std::mt19937 rng(12);
  const Tensor tok = tokens_tensor({1, 3, 1, 0, 2, 3}, {2, 3});
  Tensor wte = randn({4, 5}, rng);
  std::vector<std::vector<float>> grads;
  for (bool with_index : {false, true}) {
    Tensor w = wte.clone();
    w.set_requires_grad(true);
    Tensor y = embedding(w, Tensor(), tok, with_index ? embedding_index(tok) : Tensor());
    backward(y, Tensor::from_vector(std::vector<float>(30, 0.5f), y.shape()));
    grads.push_back(w.grad().to_vector());
  }
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("rms_norm gradients match finite differences; values are x/rms(x)*w", "[gradcheck]") {
  std::mt19937 rng(10);
  gradcheck([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-5f); },
            {randn({6, 8}, rng), randn({8}, rng)}, 1e-2f, 5e-3);
  Tensor x = Tensor::from_vector({3, 4}, {1, 2}), w = Tensor::from_vector({1, 2}, {2});
  auto y = rms_norm(x, w, 0.0f).to_vector();  // rms = sqrt((9+16)/2)
  CHECK(y[0] == Approx(3 / std::sqrt(12.5)).epsilon(1e-6));
  CHECK(y[1] == Approx(8 / std::sqrt(12.5)).epsilon(1e-6));
}

TEST_CASE("rotary_embedding gradients match finite differences; rotate_half values", "[gradcheck]") {
  std::mt19937 rng(11);
  gradcheck([](const std::vector<Tensor>& in) { return rotary_embedding(in[0], 2, 100.0f); },
            {randn({2, 5, 8}, rng)}, 1e-2f, 2e-3);
  // One head of d = 4, theta = 100: pairs (0, 2) at frequency 1 and (1, 3) at 1/10.
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}, {1, 3, 4});
  auto y = rotary_embedding(x, 1, 100.0f).to_vector();
  for (int i = 0; i < 4; ++i) CHECK(y[i] == Approx(i + 1.0));  // position 0 is the identity
  for (int t = 1; t < 3; ++t) {
    const double a0 = t * 1.0, a1 = t * 0.1;
    CHECK(y[t * 4 + 0] == Approx(1 * std::cos(a0) - 3 * std::sin(a0)).epsilon(1e-5));
    CHECK(y[t * 4 + 2] == Approx(3 * std::cos(a0) + 1 * std::sin(a0)).epsilon(1e-5));
    CHECK(y[t * 4 + 1] == Approx(2 * std::cos(a1) - 4 * std::sin(a1)).epsilon(1e-5));
    CHECK(y[t * 4 + 3] == Approx(4 * std::cos(a1) + 2 * std::sin(a1)).epsilon(1e-5));
  }
}

TEST_CASE("swiglu gradients match finite differences; values are silu(g)*u", "[gradcheck]") {
  std::mt19937 rng(12);
  gradcheck([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }, {randn({3, 7}, rng), randn({3, 7}, rng)},
            1e-2f, 2e-3);
  auto y = swiglu(Tensor::from_vector({1.5f, -2.0f}, {2}), Tensor::from_vector({2.0f, 3.0f}, {2})).to_vector();
  CHECK(y[0] == Approx(1.5 / (1 + std::exp(-1.5)) * 2).epsilon(1e-6));
  CHECK(y[1] == Approx(-2.0 / (1 + std::exp(2.0)) * 3).epsilon(1e-6));
}

TEST_CASE("grouped-query attention gradients match finite differences", "[gradcheck]") {
  std::mt19937 rng(13);
  // B=2, T=5, 4 query heads and 2 key/value heads of d=3
  gradcheck([](const std::vector<Tensor>& in) { return causal_attention(in[0], in[1], in[2], 4, 2); },
            {randn({2, 5, 12}, rng), randn({2, 5, 6}, rng), randn({2, 5, 6}, rng)}, 1e-2f, 5e-3, 60);
}

TEST_CASE("grouped-query attention equals multi-head attention on repeated key/value heads", "[ops]") {
  std::mt19937 rng(14);
  const int64_t B = 2, T = 4, H = 4, Hkv = 2, d = 3, C = H * d;
  Tensor q = randn({B, T, C}, rng), k = randn({B, T, Hkv * d}, rng), v = randn({B, T, Hkv * d}, rng);
  // Fused q|k|v with key/value head j repeated for query heads 2j and 2j+1 (HF's repeat_kv).
  std::vector<float> qkv(B * T * 3 * C);
  auto qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < d; ++i) {
        qkv[r * 3 * C + h * d + i] = qv[r * C + h * d + i];
        qkv[r * 3 * C + C + h * d + i] = kv[r * Hkv * d + (h / 2) * d + i];
        qkv[r * 3 * C + 2 * C + h * d + i] = vv[r * Hkv * d + (h / 2) * d + i];
      }
  auto a = causal_attention(q, k, v, H, Hkv).to_vector();
  auto b = causal_self_attention(Tensor::from_vector(qkv, {B, T, 3 * C}), H).to_vector();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
  CHECK_THROWS_AS(causal_attention(q, k, v, 4, 3), std::invalid_argument);
}

TEST_CASE("linear under bf16 matmuls is the GEMM of the bf16-rounded operands, forward and backward",
          "[ops][bf16]") {
  std::mt19937 rng(5);
  Tensor x = randn({6, 9}, rng), W = randn({4, 9}, rng);
  const Tensor b = randn({4}, rng), dy = randn({6, 4}, rng);
  auto rounded = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
  x.set_requires_grad(true);
  W.set_requires_grad(true);
  Tensor y;
  {
    MatmulDTypeScope bf16_matmuls(DType::bf16);
    CHECK(matmul_dtype() == DType::bf16);
    y = linear(x, W, b);
    backward(y, dy);
  }
  CHECK(matmul_dtype() == DType::f32);  // the scope restored the default
  Tensor y_ref, dx_ref = Tensor::zeros({6, 9}), dW_ref = Tensor::zeros({4, 9});
  {
    NoGradGuard ng;
    y_ref = linear(rounded(x), rounded(W), b);
  }
  Kernels& k = kernels(Device::CPU);
  const Tensor dyr = rounded(dy), Wr = rounded(W), xr = rounded(x);
  k.gemm(false, false, 6, 9, 4, 1.0f, dyr.data_f32(), Wr.data_f32(), 0.0f, dx_ref.data_f32());
  k.gemm(true, false, 4, 9, 6, 1.0f, dyr.data_f32(), xr.data_f32(), 0.0f, dW_ref.data_f32());
  // The products of bf16 operands are exact in f32; the bf16 GEMM (oneDNN's bf16 matmul where the
  // CPU has bf16 instructions, else this SGEMM) may add them in another order: K roundings of 2^-24.
  auto close = [](const Tensor& got, const Tensor& want, int64_t K) {
    const auto g = got.to_vector(), w = want.to_vector();
    REQUIRE(g.size() == w.size());
    for (size_t i = 0; i < g.size(); ++i)
      CHECK(std::fabs(g[i] - w[i]) <= K * std::ldexp(1.0, -24) * (std::fabs(w[i]) + 128.0));
  };
  close(y, y_ref, 9);
  close(x.grad(), dx_ref, 4);
  close(W.grad(), dW_ref, 6);
  NoGradGuard ng;
  CHECK(linear(x, W, b).to_vector() != y.to_vector());  // f32 matmuls do differ
  CHECK_THROWS_WITH(MatmulDTypeScope(DType::i32), Catch::Contains("f32 or bf16"));
}
