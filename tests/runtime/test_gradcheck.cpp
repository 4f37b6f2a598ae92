// Per-op gradient checks against central finite differences (f32, eps chosen per op).
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>

#include "runtime/autograd.h"
#include "runtime/kernels.h"
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
