// Fused (flash) attention against the unfused reference kernel and finite differences, and the
// memory it saves: only a log-sum-exp per query row is kept for backward.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "runtime/autograd.h"
#include "runtime/memory.h"
#include "runtime/ops.h"

using namespace mfsdp;

namespace {

std::vector<float> randn_values(int64_t n, std::mt19937& rng, float std) {
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct AttentionRun {
  std::vector<float> y, dq, dk, dv;
};

// y = causal_attention(q, k, v) and the gradients of <y, R> under `kernel`, from fixed inputs.
AttentionRun run_attention(AttentionKernel kernel, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t d,
                           uint32_t seed) {
  std::mt19937 rng(seed);
  // std 2 makes the softmax peaked, so the running max of the fused kernel changes within rows
  Tensor q = Tensor::from_vector(randn_values(B * T * H * d, rng, 2.0f), {B, T, H * d});
  Tensor k = Tensor::from_vector(randn_values(B * T * Hkv * d, rng, 2.0f), {B, T, Hkv * d});
  Tensor v = Tensor::from_vector(randn_values(B * T * Hkv * d, rng, 1.0f), {B, T, Hkv * d});
  const std::vector<float> r = randn_values(B * T * H * d, rng, 1.0f);
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  AttentionKernelScope scope(kernel);
  Tensor y = causal_attention(q, k, v, H, Hkv);
  backward(y, Tensor::from_vector(r, y.shape()));
  return {y.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector()};
}

void check_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  double scale = 1e-6, worst = 0;
  for (float x : b) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  INFO(what << ": largest difference " << worst << " against largest magnitude " << scale);
  CHECK(worst <= 2e-5 * scale);
}

}  // namespace

TEST_CASE("fused attention matches the unfused kernel forward and backward", "[attention]") {
  struct Dims { int64_t B, T, H, Hkv, d; };
  // T around the 64-row query blocks; grouped-query and multi-head; odd head dimensions
  const Dims cases[] = {{1, 1, 1, 1, 4}, {2, 5, 4, 2, 3}, {1, 64, 2, 2, 8},
                        {1, 65, 2, 1, 16}, {2, 130, 4, 2, 5}, {1, 200, 3, 3, 32}};
  uint32_t seed = 1;
  for (const Dims& c : cases) {
    INFO("B=" << c.B << " T=" << c.T << " H=" << c.H << " Hkv=" << c.Hkv << " d=" << c.d);
    const AttentionRun ref = run_attention(AttentionKernel::unfused, c.B, c.T, c.H, c.Hkv, c.d, seed);
    const AttentionRun got = run_attention(AttentionKernel::fused, c.B, c.T, c.H, c.Hkv, c.d, seed);
    ++seed;
    check_close(got.y, ref.y, "y");
    check_close(got.dq, ref.dq, "dq");
    check_close(got.dk, ref.dk, "dk");
    check_close(got.dv, ref.dv, "dv");
  }
}

TEST_CASE("fused attention gradients match finite differences", "[attention][gradcheck]") {
  // B=1, T=70 (two query blocks), 2 query heads sharing 1 key/value head of d=4; central
  // differences in f64 around f32 values, on sampled elements of q, k and v
  std::mt19937 rng(21);
  const int64_t T = 70;
  Tensor q = Tensor::from_vector(randn_values(T * 8, rng, 1.0f), {1, T, 8});
  Tensor k = Tensor::from_vector(randn_values(T * 4, rng, 1.0f), {1, T, 4});
  Tensor v = Tensor::from_vector(randn_values(T * 4, rng, 1.0f), {1, T, 4});
  const std::vector<float> r = randn_values(T * 8, rng, 1.0f);
  AttentionKernelScope scope(AttentionKernel::fused);
  auto objective = [&] {
    const std::vector<float> y = causal_attention(q, k, v, 2, 1).to_vector();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
    return s;
  };
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  backward(causal_attention(q, k, v, 2, 1), Tensor::from_vector(r, {1, T, 8}));
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  for (Tensor* t : {&q, &k, &v}) {
    const std::vector<float> g = t->grad().to_vector();
    double scale = 1e-6;
    for (float x : g) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    float* p = t->data_f32();
    for (int s = 0; s < 30; ++s) {
      const int64_t i = pick(rng) % t->numel();
      const float orig = p[i], eps = 1e-2f;
      double plus, minus;
      {
        NoGradGuard ng;
        p[i] = orig + eps;
        plus = objective();
        p[i] = orig - eps;
        minus = objective();
        p[i] = orig;
      }
      const double numeric = (plus - minus) / (2.0 * eps);
      INFO("element " << i << " analytic " << g[i] << " numeric " << numeric);
      CHECK(std::fabs(g[i] - numeric) <= 5e-3 * scale);
    }
  }
}

TEST_CASE("fused self-attention on fused q|k|v equals the unfused op", "[attention]") {
  std::mt19937 rng(5);
  const int64_t B = 2, T = 67, C = 24, H = 3;
  const std::vector<float> x = randn_values(B * T * 3 * C, rng, 1.5f), r = randn_values(B * T * C, rng, 1.0f);
  std::vector<float> y[2], g[2];
  for (int fused = 0; fused < 2; ++fused) {
    AttentionKernelScope scope(fused ? AttentionKernel::fused : AttentionKernel::unfused);
    Tensor qkv = Tensor::from_vector(x, {B, T, 3 * C});
    qkv.set_requires_grad(true);
    Tensor out = causal_self_attention(qkv, H);
    backward(out, Tensor::from_vector(r, out.shape()));
    y[fused] = out.to_vector();
    g[fused] = qkv.grad().to_vector();
  }
  check_close(y[1], y[0], "y");
  check_close(g[1], g[0], "dqkv");
}

TEST_CASE("fused attention keeps a log-sum-exp per row instead of the probabilities", "[attention][memory]") {
  const int64_t B = 2, T = 96, H = 4, d = 8;
  std::mt19937 rng(3);
  const std::vector<float> qkv_values = randn_values(B * T * 3 * H * d, rng, 1.0f);
  int64_t kept[2];
  for (int fused = 0; fused < 2; ++fused) {
    AttentionKernelScope scope(fused ? AttentionKernel::fused : AttentionKernel::unfused);
    Tensor qkv = Tensor::from_vector(qkv_values, {B, T, 3 * H * d});
    qkv.set_requires_grad(true);
    const int64_t before = MemoryTracker::instance().current(Device::CPU, MemCategory::activations);
    Tensor y = causal_self_attention(qkv, H);
    // what the forward left allocated: the output and what its backward keeps
    kept[fused] = MemoryTracker::instance().current(Device::CPU, MemCategory::activations) - before;
  }
  const int64_t out_bytes = B * T * H * d * 4;
  CHECK(kept[0] == out_bytes + B * H * T * T * 4);
  CHECK(kept[1] == out_bytes + B * H * T * 4);
}

TEST_CASE("the cudnn attention kernel is CUDA's: CPU tensors refuse it by name", "[attention]") {
  Tensor q = Tensor::zeros({1, 4, 64}), k = Tensor::zeros({1, 4, 64}), v = Tensor::zeros({1, 4, 64});
  AttentionKernelScope scope(AttentionKernel::cudnn);
  CHECK(std::string(kAttentionKernelNames.name(attention_kernel())) == "cudnn");
  CHECK_THROWS_WITH(causal_attention(q, k, v, 1, 1),
                    Catch::Matchers::Contains("[cudnn_attention_forward] the cpu backend has no cuDNN attention"));
}
