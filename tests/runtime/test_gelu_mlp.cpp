// gelu_mlp (GPT-2's MLP as one op) against linear -> gelu -> linear on the CPU: the same kernels in
// the same order, so the output and every gradient must match bit for bit, in f32 and under bf16
// matmuls, including gradients accumulated over two backwards.
#include <catch2/catch.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/autograd.h"
#include "runtime/ops.h"

using namespace mfsdp;

namespace {

std::vector<Tensor> mlp_inputs(int64_t rows, int64_t C, uint32_t seed) {
  std::mt19937 rng(seed);
  auto randn = [&](const Shape& s, float sd) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(shape_numel(s));
    for (auto& x : v) x = d(rng);
    return Tensor::from_vector(v, s).set_requires_grad(true);
  };
  return {randn({rows / 3, 3, C}, 1.0f), randn({4 * C, C}, 0.2f), randn({4 * C}, 0.1f), randn({C, 4 * C}, 0.1f),
          randn({C}, 0.1f)};
}

// Output and gradients after two backwards (the second accumulates) from fixed upstream gradients.
std::vector<std::vector<float>> run(const std::vector<Tensor>& in, bool fused) {
  std::vector<std::vector<float>> out;
  for (int pass = 0; pass < 2; ++pass) {
    const Tensor y = fused ? gelu_mlp(in[0], in[1], in[2], in[3], in[4])
                           : linear(gelu(linear(in[0], in[1], in[2])), in[3], in[4]);
    std::vector<float> g(static_cast<size_t>(y.numel()));
    std::mt19937 rng(7 + pass);
    std::normal_distribution<float> d;
    for (auto& v : g) v = d(rng);
    if (pass == 0) out.push_back(y.to_vector());
    backward(y, Tensor::from_vector(g, y.shape()));
  }
  for (const Tensor& t : in) out.push_back(t.grad().to_vector());
  return out;
}

}  // namespace

TEST_CASE("gelu_mlp equals linear -> gelu -> linear bit for bit, forward and backward", "[ops][mlp]") {
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO("matmuls in " << dtype_name(dt));
    MatmulDTypeScope scope(dt);
    const auto fused = run(mlp_inputs(3 * 11, 24, 5), true), separate = run(mlp_inputs(3 * 11, 24, 5), false);
    REQUIRE(fused.size() == 6);
    for (size_t i = 0; i < fused.size(); ++i) {
      INFO((i == 0 ? std::string("output") : "gradient of input " + std::to_string(i - 1)));
      CHECK(fused[i] == separate[i]);
    }
  }
}

TEST_CASE("gelu_mlp rejects a projection that does not take the hidden width", "[ops][mlp]") {
  const auto in = mlp_inputs(6, 8, 1);
  const Tensor bad = Tensor::zeros({8, 31});
  CHECK_THROWS_WITH(gelu_mlp(in[0], in[1], in[2], bad, in[4]),
                    Catch::Contains("gelu_mlp") && Catch::Contains("hidden width 32"));
  CHECK_THROWS_AS(gelu_mlp(in[0], in[1], in[2], in[3], Tensor::zeros({7})), std::invalid_argument);
}
