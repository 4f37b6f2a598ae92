// One table of differentiable op cases (in the style of ggml's test-backend-ops): each case builds
// its inputs from fixed seeds on the CPU and on CUDA, runs the op forward, runs backward from the
// same random upstream gradient, and compares the output and every input gradient, CUDA against
// CPU, by the normalized error max|gpu - cpu| / max|cpu|. The CUDA result must also repeat bit for
// bit. Tolerances: f32 kernels that only sum in another order 1e-5 (elementwise and norm ops, whose
// reductions are short) or 1e-4 (attention and cross-entropy, long reductions through exp); bf16
// matmul cases compare against the CPU's bf16 matmuls (the same rounded operands), 1e-5.
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "runtime/autograd.h"
#include "runtime/ops.h"

using namespace mfsdp;
using namespace mfsdp::cuda_test;

namespace {

/// A random f32 input: shape, scale, offset.
struct Input {
  Shape shape;
  float stddev = 1.0f, mean = 0.0f;
};

struct OpCase {
  std::string name;
  std::vector<Input> inputs;                                 ///< differentiable inputs
  std::function<Tensor(const std::vector<Tensor>&, Device)> op;  ///< builds the output (tokens made on the device)
  double tol = 1e-5;
  DType matmul = DType::f32;
  AttentionKernel attention = AttentionKernel::unfused;
};

struct OpResult {
  std::vector<float> out;
  std::vector<std::vector<float>> grads;
};

OpResult run_case(const OpCase& c, Device dev) {
  MatmulDTypeScope matmuls(c.matmul);
  AttentionKernelScope attention(dev == Device::CUDA ? c.attention : AttentionKernel::unfused);
  std::vector<Tensor> in;
  uint32_t seed = 100;
  for (const Input& i : c.inputs) {
    Tensor t = Tensor::from_vector(randn(shape_numel(i.shape), seed++, i.stddev, i.mean), i.shape, dev);
    t.set_requires_grad(true);
    in.push_back(t);
  }
  Tensor y = c.op(in, dev);
  if (y.numel() == 1) backward(y);
  else backward(y, Tensor::from_vector(randn(y.numel(), 99), y.shape(), dev));
  OpResult r;
  r.out = y.to_vector();
  for (const Tensor& t : in) {
    REQUIRE(t.grad().defined());
    r.grads.push_back(t.grad().to_vector());
  }
  return r;
}

const int64_t B = 2, T = 37, C = 48, H = 4;

std::vector<OpCase> op_cases() {
  const auto tokens = [](int64_t n, int32_t hi, uint32_t seed, Device dev) {
    return tokens_tensor(rand_ids(n, hi, seed), {n}, dev);
  };
  std::vector<OpCase> cases = {
      {"linear", {{{B, T, C}}, {{3 * C, C}, 0.2f}, {{3 * C}, 0.1f}},
       [](const std::vector<Tensor>& x, Device) { return linear(x[0], x[1], x[2]); }},
      {"linear (no bias)", {{{B * T, C}}, {{C + 5, C}, 0.2f}},
       [](const std::vector<Tensor>& x, Device) { return linear(x[0], x[1]); }},
      {"linear bf16 matmuls", {{{B, T, C}}, {{2 * C, C}, 0.2f}, {{2 * C}, 0.1f}},
       [](const std::vector<Tensor>& x, Device) { return linear(x[0], x[1], x[2]); }, 1e-5, DType::bf16},
      {"add", {{{B, T, C}}, {{B, T, C}}}, [](const std::vector<Tensor>& x, Device) { return add(x[0], x[1]); }},
      {"layer_norm", {{{B, T, C}}, {{C}, 0.1f, 1.0f}, {{C}, 0.1f}},
       [](const std::vector<Tensor>& x, Device) { return layer_norm(x[0], x[1], x[2]); }},
      {"gelu", {{{B, T, 4 * C}, 2.0f}}, [](const std::vector<Tensor>& x, Device) { return gelu(x[0]); }},
      {"embedding", {{{61, C}, 0.1f}, {{T, C}, 0.1f}},
       [tokens](const std::vector<Tensor>& x, Device dev) {
         return embedding(x[0], x[1], tokens(B * T, 61, 7, dev).reshape({B, T}));
       }},
      {"causal_self_attention", {{{B, T, 3 * C}}},
       [](const std::vector<Tensor>& x, Device) { return causal_self_attention(x[0], H); }, 1e-4},
      {"causal_self_attention fused", {{{B, T, 3 * C}}},
       [](const std::vector<Tensor>& x, Device) { return causal_self_attention(x[0], H); }, 1e-4, DType::f32,
       AttentionKernel::fused},
      {"causal_attention GQA", {{{B, T, C}}, {{B, T, C / 2}}, {{B, T, C / 2}}},
       [](const std::vector<Tensor>& x, Device) { return causal_attention(x[0], x[1], x[2], H, H / 2); }, 1e-4},
      {"causal_attention GQA fused", {{{B, T, C}}, {{B, T, C / 2}}, {{B, T, C / 2}}},
       [](const std::vector<Tensor>& x, Device) { return causal_attention(x[0], x[1], x[2], H, H / 2); }, 1e-4,
       DType::f32, AttentionKernel::fused},
      {"rms_norm", {{{B, T, C}}, {{C}, 0.1f, 1.0f}},
       [](const std::vector<Tensor>& x, Device) { return rms_norm(x[0], x[1]); }},
      {"rotary_embedding", {{{B, T, C}}},
       [](const std::vector<Tensor>& x, Device) { return rotary_embedding(x[0], H); }},
      {"swiglu", {{{B, T, 2 * C}, 2.0f}, {{B, T, 2 * C}}},
       [](const std::vector<Tensor>& x, Device) { return swiglu(x[0], x[1]); }},
      {"cross_entropy (padded vocabulary)", {{{B * T, 64}, 2.0f}},
       [tokens](const std::vector<Tensor>& x, Device dev) {
         return cross_entropy(x[0], tokens(B * T, 61, 8, dev), 61);
       }, 1e-4},
  };
  return cases;
}

}  // namespace

TEST_CASE("cuda: every differentiable op, forward and backward, against the CPU (one table)", "[cuda][ops][table]") {
  REQUIRE_GPU();
  for (const OpCase& c : op_cases()) {
    INFO("op case: " << c.name);
    const OpResult cpu = run_case(c, Device::CPU), gpu = run_case(c, Device::CUDA);
    CHECK(norm_err(gpu.out, cpu.out) <= c.tol);
    REQUIRE(gpu.grads.size() == cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      INFO("gradient of input " << i);
      double norm = 0;
      for (float v : cpu.grads[i]) norm += static_cast<double>(v) * v;
      CHECK(norm > 0);  // the case exercises every input
      CHECK(norm_err(gpu.grads[i], cpu.grads[i]) <= c.tol);
    }
    const OpResult again = run_case(c, Device::CUDA);  // reproducible: no atomics, fixed orders
    CHECK(again.out == gpu.out);
    CHECK(again.grads == gpu.grads);
  }
}
