// One table of differentiable op cases (in the style of ggml's test-backend-ops): each case builds
// its inputs from fixed seeds on the CPU and on CUDA, runs the op forward, runs backward from the
// same random upstream gradient, and compares the output and every input gradient, CUDA against
// CPU, element by element: |gpu - cpu| <= atol + rtol |cpu| (see Tol). The CUDA result must also
// repeat bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "runtime/autograd.h"
#include "runtime/ops.h"
#include "runtime/ops_moe.h"

using namespace mfsdp;
using namespace mfsdp::cuda_test;

namespace {

/// Per-element tolerance |gpu - cpu| <= atol * rms(cpu) + rtol * |cpu|. Both devices compute the
/// same f32 formulas on the same inputs; they differ only in summation order and in the last ulps
/// of transcendental functions. A reduction of K terms reordered moves its f32 result by about
/// sqrt(K) u (u = 2^-24 = 6e-8) of the magnitudes summed, which is what atol absorbs for elements
/// that cancel to near zero; it is stated in units of the tensor's RMS because the summed terms
/// scale with the data. rtol bounds the relative error of every other element.
///   f32, short reductions (K <= ~150: linear over C = 48, norms over C, bias/LN column sums over
///     B*T = 74 rows, elementwise ops with tanh/exp/sigmoid, ulp-accurate on both): 1e-5 and 1e-5,
///     about 100 u: ample for sqrt(K) u and a few ulps, far below any wrong index or formula.
///   f32, long reductions through exp (attention over T = 37 keys and head dims, softmax
///     normalization, cross-entropy over the vocabulary, flash attention's online rescaling,
///     whose exp of running maxima differs from the two-pass softmax by a few ulps per step):
///     1e-4 and 1e-4.
///   bf16 matmuls: both devices round the same f32 operands to bf16 bitwise alike (tested in
///     test_cuda_backend.cpp), products of two 8-bit mantissas are exact in f32 and sums are f32,
///     so the bf16 case differs from the CPU exactly as f32 does: 1e-5 and 1e-5.
///   the fused classifier under bf16 matmuls: its backward GEMMs take the logits' gradient, which
///     each device computes in f32 (through exp, kF32Long apart) and then rounds to bf16; an
///     element within an f32 ulp or two of a bf16 rounding boundary rounds to neighbouring bf16
///     values (one step of 8 significant bits: 2^-7 / m of the value for a mantissa m in [1, 2),
///     at most 7.8e-3), so a few terms of dh (64 vocabulary terms) and dW (74 row terms) may move
///     by up to 2^-7 of themselves. The largest term is a target column's -(1 - p)/N times an
///     input (|x| < 4 standard deviations here), at most about 4 times the output's RMS, which the
///     target terms dominate: 2^-7 x 4 = 3.1e-2, so 4e-2 and 1e-4 (a wrong index or formula moves
///     elements by O(1) of the RMS).
///   cuDNN attention (bf16 operands) against the CPU's f32 attention on the same bf16-rounded q, k,
///     v and upstream gradient, both results rounded to bf16: scores are exact bf16 products summed
///     in f32 on both sides, but cuDNN rounds the probabilities P (and in backward dS) to bf16
///     before the second GEMM, a relative error of at most 2^-9 per term, and forms D = dO . O
///     from its bf16 O. A sum of N terms of random sign is about sqrt(N) terms large; terms that
///     each move by 2^-9 of themselves, all the same way, move it by at most 2^-9 N terms, i.e.
///     2^-9 sqrt(N) of its scale: N <= T g = 200 here (T = 100 keys, g = 2 query heads per
///     key/value head) gives 0.028, so atol 3e-2 (of the RMS). The last rounding to bf16 on each
///     side may land on neighbouring bf16 values (at most 2^-7 apart, relative): rtol 2^-7. A
///     wrong head mapping, mask or scale moves elements by O(1) of the RMS.
///   gelu_mlp under bf16 matmuls: the GPU's c_fc GEMM applies bias and GELU in cuBLASLt's
///     epilogue, whose GELU (and GELU') is held to 2^-9 of the value plus 2^-10 of the RMS in
///     test_cuda_epilogue.cpp; h then rounds to bf16 (steps of at most 2^-7 of the value), so an
///     element of h can land one bf16 step from the CPU's: at most (2^-7 + 2^-9) ~ 9.8e-3 of
///     itself. The projection sums hidden = 192 such terms of random sign: about 1e-2 of the
///     output's scale if every term moved (and fewer do), so atol 2e-2 (of the RMS), rtol 1e-2; the
///     backward's dpre rounds to bf16 for its two GEMMs the same way. A wrong bias, index or formula moves elements by O(1).
///   a norm's or SwiGLU's bf16 output (the models ask for it under bf16 matmuls): each device rounds its
///     f32 result (kF32Short apart) to bf16, and an element within an ulp or two of a rounding
///     boundary lands on the neighbouring bf16 value, one step of 8 significant bits away: 2^-7 / m
///     of itself for a mantissa m in [1, 2), at most 7.8e-3: rtol 7.9e-3, atol 1e-5 (of the RMS).
///     The gradients are f32 from the f32 inputs and statistics, so they keep kF32Short.
///   attention's bf16 output (unfused, fused): each device rounds its f32 output (kF32Long apart),
///     so, as for the norms, an element can land one bf16 step away: rtol 7.9e-3, atol 1e-4 (of the
///     RMS). The backward reads the same saved f32 tensors as the f32 output's: kF32Long.
///     That a bf16 output is each device's own f32 output rounded, with that output's gradients, is
///     checked bit for bit on the device by the test after the table.
///   cuDNN's log-sum-exp (f32, from exact bf16 products summed in f32 and its exp/log): kF32Long.
struct Tol {
  double atol, rtol;
};
constexpr Tol kF32Short{1e-5, 1e-5}, kF32Long{1e-4, 1e-4}, kBf16Matmul{1e-5, 1e-5}, kBf16Classifier{4e-2, 1e-4},
    kCudnnAttention{3e-2, 7.8e-3}, kBf16Epilogue{2e-2, 1e-2}, kBf16Rounded{1e-5, 7.9e-3},
    kBf16RoundedLong{1e-4, 7.9e-3};

/// Every element of `got` within the tolerance of `ref`; reports the count and the worst element.
void check_elements(const std::vector<float>& got, const std::vector<float>& ref, Tol tol) {
  REQUIRE(got.size() == ref.size());
  double sq = 0;
  for (float v : ref) sq += static_cast<double>(v) * v;
  const double rms = ref.empty() ? 0.0 : std::sqrt(sq / static_cast<double>(ref.size()));
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double bound = tol.atol * rms + tol.rtol * std::fabs(static_cast<double>(ref[i]));
    const double ratio = std::isnan(err) ? INFINITY : (bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0));
    if (ratio > 1) ++bad;
    if (ratio > worst_ratio || worst < 0) {
      worst_ratio = ratio;
      worst = static_cast<int64_t>(i);
    }
  }
  INFO(bad << " of " << ref.size() << " elements outside atol " << tol.atol << " * rms " << rms << " + rtol "
           << tol.rtol << " * |ref|; worst: element " << worst << ", gpu " << (worst >= 0 ? got[worst] : 0.0f)
           << ", cpu " << (worst >= 0 ? ref[worst] : 0.0f) << " (" << worst_ratio << " x its bound)");
  CHECK(bad == 0);
}

/// A random f32 input: shape, scale, offset.
struct Input {
  Shape shape;
  float stddev = 1.0f, mean = 0.0f;
};

struct OpCase {
  std::string name;
  std::vector<Input> inputs;                                 ///< differentiable inputs
  std::function<Tensor(const std::vector<Tensor>&, Device)> op;  ///< builds the output (tokens made on the device)
  Tol tol = kF32Short;
  DType matmul = DType::f32;
  AttentionKernel attention = AttentionKernel::unfused;
  std::optional<Tol> grad_tol;  ///< the gradients' tolerance when it is not `tol` (a bf16 output's f32 gradients)
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

// moe_feed_forward over 4 routed experts of width 32, top 2, both router losses on; inputs: x
// [B, T, C], the router, the experts' gate/up/down, then (with a shared expert) its gate/up/down
// of width 40 and its gate [1, C].
OpCase moe_case(const std::string& name, bool shared, bool norm_topk_prob) {
  const int64_t E = 4, I = 32, Is = 40;
  std::vector<Input> in{{{B, T, C}}, {{E, C}, 0.5f}};
  for (int64_t e = 0; e < E; ++e) in.insert(in.end(), {{{I, C}, 0.2f}, {{I, C}, 0.2f}, {{C, I}, 0.2f}});
  if (shared) in.insert(in.end(), {{{Is, C}, 0.2f}, {{Is, C}, 0.2f}, {{C, Is}, 0.2f}, {{1, C}, 0.2f}});
  auto op = [shared, norm_topk_prob](const std::vector<Tensor>& x, Device) {
    std::vector<SwigluWeights> experts;
    for (size_t e = 0; e < 4; ++e) experts.push_back({x[2 + 3 * e], x[3 + 3 * e], x[4 + 3 * e]});
    MoeOptions opt;
    opt.top_k = 2;
    opt.norm_topk_prob = norm_topk_prob;
    opt.aux_loss_weight = 0.1;
    opt.z_loss_weight = 0.01;
    if (!shared) return moe_feed_forward(x[0], x[1], experts, {}, {}, opt);
    return moe_feed_forward(x[0], x[1], experts, {x[14], x[15], x[16]}, x[17], opt);
  };
  // softmax over 4 experts, dots over C and the experts' GEMMs: short sums, but chained through the
  // router's softmax and the aux losses' gradient over all 74 tokens
  OpCase c;
  c.name = name;
  c.inputs = std::move(in);
  c.op = op;
  c.tol = kF32Long;
  return c;
}

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
       [](const std::vector<Tensor>& x, Device) { return linear(x[0], x[1], x[2]); }, kBf16Matmul, DType::bf16},
      // GPT-2's MLP, C -> 4C -> C: f32 runs the separate kernels on both devices; bf16 matmuls run
      // cuBLASLt's bias, bias+GELU and GELU-gradient+bias-gradient epilogues on CUDA
      {"gelu_mlp", {{{B, T, C}}, {{4 * C, C}, 0.2f}, {{4 * C}, 0.1f}, {{C, 4 * C}, 0.1f}, {{C}, 0.1f}},
       [](const std::vector<Tensor>& x, Device) { return gelu_mlp(x[0], x[1], x[2], x[3], x[4]); }},
      {"gelu_mlp bf16 matmuls", {{{B, T, C}}, {{4 * C, C}, 0.2f}, {{4 * C}, 0.1f}, {{C, 4 * C}, 0.1f}, {{C}, 0.1f}},
       [](const std::vector<Tensor>& x, Device) { return gelu_mlp(x[0], x[1], x[2], x[3], x[4]); }, kBf16Epilogue,
       DType::bf16},
      {"add", {{{B, T, C}}, {{B, T, C}}}, [](const std::vector<Tensor>& x, Device) { return add(x[0], x[1]); }},
      {"layer_norm", {{{B, T, C}}, {{C}, 0.1f, 1.0f}, {{C}, 0.1f}},
       [](const std::vector<Tensor>& x, Device) { return layer_norm(x[0], x[1], x[2]); }},
      {"layer_norm bf16 output", {{{B, T, C}}, {{C}, 0.1f, 1.0f}, {{C}, 0.1f}},
       [](const std::vector<Tensor>& x, Device) { return layer_norm(x[0], x[1], x[2], 1e-5f, DType::bf16); },
       kBf16Rounded, DType::bf16, AttentionKernel::unfused, kF32Short},
      {"rms_norm bf16 output", {{{B, T, C}}, {{C}, 0.1f, 1.0f}},
       [](const std::vector<Tensor>& x, Device) { return rms_norm(x[0], x[1], 1e-5f, DType::bf16); }, kBf16Rounded,
       DType::bf16, AttentionKernel::unfused, kF32Short},
      {"gelu", {{{B, T, 4 * C}, 2.0f}}, [](const std::vector<Tensor>& x, Device) { return gelu(x[0]); }},
      {"embedding", {{{61, C}, 0.1f}, {{T, C}, 0.1f}},
       [tokens](const std::vector<Tensor>& x, Device dev) {
         return embedding(x[0], x[1], tokens(B * T, 61, 7, dev).reshape({B, T}));
       }},
      {"causal_self_attention", {{{B, T, 3 * C}}},
       [](const std::vector<Tensor>& x, Device) { return causal_self_attention(x[0], H); }, kF32Long},
      {"causal_self_attention fused", {{{B, T, 3 * C}}},
       [](const std::vector<Tensor>& x, Device) { return causal_self_attention(x[0], H); }, kF32Long, DType::f32,
       AttentionKernel::fused},
      {"causal_self_attention fused, bf16 output", {{{B, T, 3 * C}}},
       [](const std::vector<Tensor>& x, Device) { return causal_self_attention(x[0], H, DType::bf16); },
       kBf16RoundedLong, DType::bf16, AttentionKernel::fused, kF32Long},
      {"causal_attention GQA", {{{B, T, C}}, {{B, T, C / 2}}, {{B, T, C / 2}}},
       [](const std::vector<Tensor>& x, Device) { return causal_attention(x[0], x[1], x[2], H, H / 2); }, kF32Long},
      {"causal_attention GQA fused", {{{B, T, C}}, {{B, T, C / 2}}, {{B, T, C / 2}}},
       [](const std::vector<Tensor>& x, Device) { return causal_attention(x[0], x[1], x[2], H, H / 2); }, kF32Long,
       DType::f32, AttentionKernel::fused},
      {"causal_attention GQA bf16 output", {{{B, T, C}}, {{B, T, C / 2}}, {{B, T, C / 2}}},
       [](const std::vector<Tensor>& x, Device) { return causal_attention(x[0], x[1], x[2], H, H / 2, DType::bf16); },
       kBf16RoundedLong, DType::bf16, AttentionKernel::unfused, kF32Long},
      {"rms_norm", {{{B, T, C}}, {{C}, 0.1f, 1.0f}},
       [](const std::vector<Tensor>& x, Device) { return rms_norm(x[0], x[1]); }},
      {"rotary_embedding", {{{B, T, C}}},
       [](const std::vector<Tensor>& x, Device) { return rotary_embedding(x[0], H); }},
      {"swiglu", {{{B, T, 2 * C}, 2.0f}, {{B, T, 2 * C}}},
       [](const std::vector<Tensor>& x, Device) { return swiglu(x[0], x[1]); }},
      {"swiglu bf16 output", {{{B, T, 2 * C}, 2.0f}, {{B, T, 2 * C}}},
       [](const std::vector<Tensor>& x, Device) { return swiglu(x[0], x[1], DType::bf16); }, kBf16Rounded,
       DType::bf16, AttentionKernel::unfused, kF32Short},
      {"cross_entropy (padded vocabulary)", {{{B * T, 64}, 2.0f}},
       [tokens](const std::vector<Tensor>& x, Device dev) {
         return cross_entropy(x[0], tokens(B * T, 61, 8, dev), 61);
       }, kF32Long},
      // the fused classifier (LM head + cross-entropy) in chunks of 16 rows: 4 full, 1 ragged of 10
      {"classifier_loss (chunks of 16 rows)", {{{B * T, C}}, {{64, C}, 0.2f}},
       [tokens](const std::vector<Tensor>& x, Device dev) {
         return classifier_loss(x[0], x[1], tokens(B * T, 61, 9, dev), 61, 0, 16);
       }, kF32Long},
      {"classifier_loss bf16 matmuls (chunks of 16 rows)", {{{B * T, C}}, {{64, C}, 0.2f}},
       [tokens](const std::vector<Tensor>& x, Device dev) {
         return classifier_loss(x[0], x[1], tokens(B * T, 61, 9, dev), 61, 0, 16);
       }, kBf16Classifier, DType::bf16},
      moe_case("moe_feed_forward (4 experts, top 2, shared expert, norm_topk_prob)", true, true),
      moe_case("moe_feed_forward (4 experts, top 2, no shared expert)", false, false),
  };
  return cases;
}

}  // namespace

TEST_CASE("cuda: every differentiable op, forward and backward, against the CPU (one table)", "[cuda][ops][table]") {
  REQUIRE_GPU();
  for (const OpCase& c : op_cases()) {
    INFO("op case: " << c.name);
    const OpResult cpu = run_case(c, Device::CPU), gpu = run_case(c, Device::CUDA);
    {
      INFO("output");
      check_elements(gpu.out, cpu.out, c.tol);
    }
    REQUIRE(gpu.grads.size() == cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      INFO("gradient of input " << i);
      double norm = 0;
      for (float v : cpu.grads[i]) norm += static_cast<double>(v) * v;
      CHECK(norm > 0);  // the case exercises every input
      check_elements(gpu.grads[i], cpu.grads[i], c.grad_tol.value_or(c.tol));
    }
    const OpResult again = run_case(c, Device::CUDA);  // reproducible: no atomics, fixed orders
    CHECK(again.out == gpu.out);
    CHECK(again.grads == gpu.grads);
  }
}

namespace {

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

/// One cuDNN attention shape: fused GPT-2 qkv [B, T, 3 H d] (strided q, k, v) or separate q [B, T, H d],
/// k and v [B, T, Hkv d].
struct SdpaCase {
  const char* name;
  int64_t B, T, H, Hkv, d;
  bool fused_qkv;
};

/// Forward and backward of `c` on `dev` with `kind` and the output in `out_dtype`, from
/// bf16-representable inputs and upstream gradient.
OpResult run_sdpa(const SdpaCase& c, Device dev, AttentionKernel kind, const std::vector<std::vector<float>>& inputs,
                  const std::vector<float>& dy, DType out_dtype = DType::f32) {
  AttentionKernelScope scope(kind);
  std::vector<Shape> shapes;
  if (c.fused_qkv) shapes = {{c.B, c.T, 3 * c.H * c.d}};
  else shapes = {{c.B, c.T, c.H * c.d}, {c.B, c.T, c.Hkv * c.d}, {c.B, c.T, c.Hkv * c.d}};
  std::vector<Tensor> in;
  for (size_t i = 0; i < shapes.size(); ++i) {
    in.push_back(Tensor::from_vector(inputs[i], shapes[i], dev));
    in.back().set_requires_grad(true);
  }
  Tensor y = c.fused_qkv ? causal_self_attention(in[0], c.H, out_dtype)
                         : causal_attention(in[0], in[1], in[2], c.H, c.Hkv, out_dtype);
  REQUIRE(y.dtype() == out_dtype);
  backward(y, Tensor::from_vector(dy, y.shape(), dev));
  OpResult r{y.to_vector(), {}};
  for (const Tensor& t : in) r.grads.push_back(t.grad().to_vector());
  return r;
}

}  // namespace

TEST_CASE("cuda: cuDNN attention (GQA, d = 64 and 128, ragged T) against the CPU on bf16-rounded inputs",
          "[cuda][ops][cudnn][attention]") {
  REQUIRE_GPU();
  // a device is visible: a build without cuDNN would leave these cases unrun, which is a failure
  REQUIRE(cudnn_attention_built());
  const SdpaCase cases[] = {
      {"MHA d=64 T=37", 2, 37, 2, 2, 64, false},       {"GQA 4/2 d=64 T=100", 2, 100, 4, 2, 64, false},
      {"GQA 4/2 d=128 T=37", 1, 37, 4, 2, 128, false}, {"MQA 2/1 d=128 T=100", 2, 100, 2, 1, 128, false},
      {"fused qkv d=64 T=37", 2, 37, 2, 2, 64, true},
  };
  uint32_t seed = 700;
  for (const SdpaCase& c : cases) {
    INFO("cuDNN case: " << c.name);
    const int64_t rows = c.B * c.T;
    std::vector<std::vector<float>> inputs;
    if (c.fused_qkv) inputs = {bf16_rounded(randn(rows * 3 * c.H * c.d, seed++))};
    else
      inputs = {bf16_rounded(randn(rows * c.H * c.d, seed++)), bf16_rounded(randn(rows * c.Hkv * c.d, seed++)),
                bf16_rounded(randn(rows * c.Hkv * c.d, seed++))};
    const std::vector<float> dy = bf16_rounded(randn(rows * c.H * c.d, seed++));
    const OpResult cpu = run_sdpa(c, Device::CPU, AttentionKernel::unfused, inputs, dy);
    const OpResult gpu = run_sdpa(c, Device::CUDA, AttentionKernel::cudnn, inputs, dy);
    CHECK(gpu.out == bf16_rounded(gpu.out));  // cuDNN's bf16 output, widened
    {
      INFO("output");
      check_elements(gpu.out, bf16_rounded(cpu.out), kCudnnAttention);
    }
    REQUIRE(gpu.grads.size() == cpu.grads.size());
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      INFO("gradient of input " << i);
      double norm = 0;
      for (float v : cpu.grads[i]) norm += static_cast<double>(v) * v;
      CHECK(norm > 0);
      check_elements(gpu.grads[i], bf16_rounded(cpu.grads[i]), kCudnnAttention);
    }
    const OpResult again = run_sdpa(c, Device::CUDA, AttentionKernel::cudnn, inputs, dy);  // deterministic backward
    CHECK(again.out == gpu.out);
    CHECK(again.grads == gpu.grads);
    // the bf16 output the models ask for under bf16 matmuls is cuDNN's own, with the same gradients
    const OpResult half = run_sdpa(c, Device::CUDA, AttentionKernel::cudnn, inputs, dy, DType::bf16);
    CHECK(half.out == gpu.out);
    CHECK(half.grads == gpu.grads);
  }
}

TEST_CASE("cuda: cuDNN attention's log-sum-exp is the natural log of each row's causal score sum", "[cuda][cudnn][attention]") {
  REQUIRE_GPU();
  REQUIRE(cudnn_attention_built());
  const int64_t Bn = 2, Tn = 37, Hn = 4, Hkv = 2, d = 64;
  const Kernels::AttentionDims a{Bn, Tn, Hn, Hkv, d, Hn * d, Hkv * d};
  const Pair q(bf16_rounded(randn(Bn * Tn * Hn * d, 801))), k(bf16_rounded(randn(Bn * Tn * Hkv * d, 802))),
      v(bf16_rounded(randn(Bn * Tn * Hkv * d, 803)));
  Pair out(fvec(Bn * Tn * Hn * d)), lse(fvec(Bn * Hn * Tn));
  const Tensor out16 = Tensor::empty({Bn * Tn * Hn * d}, DType::bf16, Device::CUDA);  // cuDNN writes bf16
  CK().flash_attention_forward(q.c(), k.c(), v.c(), out.c(), lse.c(), a);
  GK().cudnn_attention_forward(q.g(), k.g(), v.g(), out16.data<uint16_t>(), lse.g(), a);
  check_elements(lse.gpu.to_vector(), lse.cpu.to_vector(), kF32Long);
  check_elements(out16.to_vector(), bf16_rounded(out.cpu.to_vector()), kCudnnAttention);
  // other head sizes are refused by name
  const Kernels::AttentionDims d32{Bn, Tn, Hn, Hkv, 32, Hn * 32, Hkv * 32};
  CHECK_THROWS_WITH(GK().cudnn_attention_forward(q.g(), k.g(), v.g(), out16.data<uint16_t>(), lse.g(), d32),
                    Catch::Matchers::Contains("head size 32 not supported: cuDNN attention takes 64 or 128"));
}

TEST_CASE("cuda: a bf16 output is the device's own f32 output rounded, with that output's gradients",
          "[cuda][ops][bf16]") {
  REQUIRE_GPU();
  struct Row {
    const char* name;
    std::vector<Input> inputs;
    std::function<Tensor(const std::vector<Tensor>&, DType)> op;
    AttentionKernel attention = AttentionKernel::unfused;
  };
  const std::vector<Row> rows = {
      {"layer_norm", {{{B, T, C}}, {{C}, 0.1f, 1.0f}, {{C}, 0.1f}},
       [](const std::vector<Tensor>& x, DType dt) { return layer_norm(x[0], x[1], x[2], 1e-5f, dt); }},
      {"rms_norm", {{{B, T, C}}, {{C}, 0.1f, 1.0f}},
       [](const std::vector<Tensor>& x, DType dt) { return rms_norm(x[0], x[1], 1e-5f, dt); }},
      {"swiglu", {{{B, T, 2 * C}, 2.0f}, {{B, T, 2 * C}}},
       [](const std::vector<Tensor>& x, DType dt) { return swiglu(x[0], x[1], dt); }},
      {"causal_self_attention", {{{B, T, 3 * C}}},
       [](const std::vector<Tensor>& x, DType dt) { return causal_self_attention(x[0], H, dt); }},
      {"causal_self_attention fused", {{{B, T, 3 * C}}},
       [](const std::vector<Tensor>& x, DType dt) { return causal_self_attention(x[0], H, dt); },
       AttentionKernel::fused},
      {"causal_attention GQA fused", {{{B, T, C}}, {{B, T, C / 2}}, {{B, T, C / 2}}},
       [](const std::vector<Tensor>& x, DType dt) { return causal_attention(x[0], x[1], x[2], H, H / 2, dt); },
       AttentionKernel::fused},
  };
  for (const Row& r : rows) {
    INFO("op: " << r.name);
    auto with_output = [&r](DType dt) {
      OpCase c{r.name, r.inputs, [&r, dt](const std::vector<Tensor>& x, Device) { return r.op(x, dt); }};
      c.matmul = DType::bf16;
      c.attention = r.attention;
      return c;
    };
    const OpResult full = run_case(with_output(DType::f32), Device::CUDA);
    const OpResult half = run_case(with_output(DType::bf16), Device::CUDA);
    CHECK(half.out == bf16_rounded(full.out));
    CHECK(half.grads == full.grads);
  }
}
