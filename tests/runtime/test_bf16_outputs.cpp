// The ops' bf16 outputs (out_dtype bf16, what the models ask of the norms, attention and SwiGLU under
// bf16 matmuls): the f32 output rounded, bit for bit, with the f32 output's gradients; and the GEMM
// ops taking a bf16 input as their operand with the bits of the f32 input they would have rounded.
#include <catch2/catch.hpp>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/autograd.h"
#include "runtime/ops.h"

using namespace mfsdp;

namespace {

Tensor randn(const Shape& s, uint32_t seed, float sd = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(rng);
  return Tensor::from_vector(v, s).set_requires_grad(true);
}

// The output (as f32 values) and the inputs' gradients after a backward from a fixed upstream.
std::vector<std::vector<float>> run(const std::vector<Tensor>& in, const std::function<Tensor()>& f) {
  const Tensor y = f();
  std::vector<float> g(static_cast<size_t>(y.numel()));
  std::mt19937 rng(3);
  std::normal_distribution<float> d;
  for (auto& v : g) v = d(rng);
  std::vector<std::vector<float>> out{y.to_vector()};
  backward(y, Tensor::from_vector(g, y.shape()));
  for (const Tensor& t : in) out.push_back(t.grad().to_vector());
  return out;
}

std::vector<Tensor> fresh(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(Tensor::from_vector(t.to_vector(), t.shape()).set_requires_grad(true));
  return out;
}

// The op `call` with a bf16 and an f32 output, from the same inputs and upstream gradient: the bf16
// output is the f32 one rounded and every input's gradient is bitwise the f32 output's.
void check_bf16_output(const std::vector<Tensor>& inputs,
                       const std::function<Tensor(const std::vector<Tensor>&, DType)>& call) {
  const std::vector<Tensor> a = fresh(inputs), b = fresh(inputs);
  const auto half = run(a, [&] {
    const Tensor y = call(a, DType::bf16);
    REQUIRE(y.dtype() == DType::bf16);
    return y;
  });
  const auto full = run(b, [&] { return call(b, DType::f32); });
  CHECK(half[0] == Tensor::from_vector(full[0], {static_cast<int64_t>(full[0].size())}).to(DType::bf16).to_vector());
  for (size_t i = 1; i < full.size(); ++i) {
    INFO("gradient of input " << i - 1);
    CHECK(half[i] == full[i]);  // the backward reads the inputs and saved statistics, not the result
  }
}

}  // namespace

TEST_CASE("layer_norm and rms_norm with bf16 output: the f32 output rounded, with its gradients", "[ops][bf16]") {
  const std::vector<Tensor> ln{randn({5, 7, 40}, 1, 2.0f, 0.5f), randn({40}, 2, 0.1f, 1.0f), randn({40}, 3, 0.1f)};
  SECTION("layer_norm") {
    check_bf16_output(ln, [](const std::vector<Tensor>& t, DType dt) { return layer_norm(t[0], t[1], t[2], 1e-5f, dt); });
  }
  SECTION("rms_norm") {
    check_bf16_output({ln[0], ln[1]}, [](const std::vector<Tensor>& t, DType dt) { return rms_norm(t[0], t[1], 1e-5f, dt); });
  }
  CHECK_THROWS_AS(layer_norm(ln[0], ln[1], ln[2], 1e-5f, DType::i32), std::invalid_argument);
}

TEST_CASE("attention and swiglu with bf16 output: the f32 output rounded, with its gradients", "[ops][bf16]") {
  const int64_t B = 2, T = 70, H = 4, d = 8;  // T > 64: the fused CPU kernel's query blocks
  SECTION("swiglu") {
    check_bf16_output({randn({3, 5, 24}, 11, 2.0f), randn({3, 5, 24}, 12)},
                      [](const std::vector<Tensor>& t, DType dt) { return swiglu(t[0], t[1], dt); });
    CHECK_THROWS_AS(swiglu(randn({4}, 1), randn({4}, 2), DType::i32), std::invalid_argument);
  }
  for (AttentionKernel kind : {AttentionKernel::unfused, AttentionKernel::fused}) {
    DYNAMIC_SECTION("attention, " << kAttentionKernelNames.name(kind) << " kernel") {
      AttentionKernelScope scope(kind);
      check_bf16_output({randn({B, T, 3 * H * d}, 13)}, [&](const std::vector<Tensor>& t, DType dt) {
        return causal_self_attention(t[0], H, dt);
      });
      check_bf16_output({randn({B, T, H * d}, 14), randn({B, T, H / 2 * d}, 15), randn({B, T, H / 2 * d}, 16)},
                        [&](const std::vector<Tensor>& t, DType dt) { return causal_attention(t[0], t[1], t[2], H, H / 2, dt); });
      CHECK_THROWS_WITH(causal_self_attention(randn({B, T, 3 * H * d}, 13), H, DType::i32),
                        Catch::Contains("output dtype must be f32 or bf16"));
    }
  }
}

TEST_CASE("linear and the classifier take a bf16 input as their operand under bf16 matmuls only", "[ops][bf16]") {
  const Tensor x = randn({6, 16}, 4), W = randn({24, 16}, 5, 0.2f), b = randn({24}, 6, 0.1f);
  {
    MatmulDTypeScope scope(DType::bf16);
    const std::vector<Tensor> p = fresh({x, W, b}), q = fresh({x, W, b});
    Tensor xb = p[0].to(DType::bf16);  // a leaf of its own: its f32 gradient is checked against p[0]'s
    xb.set_requires_grad(true);
    const auto rounded_here = run({xb, p[1], p[2]}, [&] { return linear(xb, p[1], p[2]); });
    const auto rounded_by_linear = run(q, [&] { return linear(q[0], q[1], q[2]); });
    for (size_t i = 0; i < rounded_here.size(); ++i) {
      INFO("result " << i);
      CHECK(rounded_here[i] == rounded_by_linear[i]);
    }
  }
  MatmulDTypeScope f32(DType::f32);
  CHECK_THROWS_WITH(linear(x.to(DType::bf16), W, b), Catch::Contains("bf16 matmuls"));
}
