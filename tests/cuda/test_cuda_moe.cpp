// CUDA backend vs CPU backend for the mixture-of-experts row kernels (Kernels::gather_rows,
// combine_rows, combine_rows_backward, gated_add_rows, gated_add_rows_backward) and
// moe_feed_forward on CUDA tensors: its routing, and experts that get no tokens (the op's values
// and gradients with every expert busy are in the op table, test_cuda_op_table.cpp). Copies and
// unweighted sums in the CPU's order must match it bitwise; the rest within a few f32 ulps
// (normalized max error, as test_cuda_backend.cpp).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_test_util.h"
#include "runtime/autograd.h"
#include "runtime/ops_moe.h"

using namespace mfsdp;
using namespace mfsdp::cuda_test;

namespace {

// Each token's K distinct rows of an [N K, cols] expert-major buffer, as the MoE op builds them: a
// permutation of 0..N K - 1, with a token's rows ascending.
std::vector<int32_t> row_lists(int64_t N, int64_t K, uint32_t seed) {
  std::vector<int32_t> perm(static_cast<size_t>(N * K));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t n = 0; n < N; ++n) std::sort(perm.begin() + n * K, perm.begin() + (n + 1) * K);
  return perm;
}

}  // namespace

TEST_CASE("cuda: the MoE row kernels vs CPU (dispatch, combine, their backward, the gated add)", "[cuda][moe]") {
  REQUIRE_GPU();
  const int64_t N = 75, K = 3, C = 300, R = N * K;  // C > the 256 threads of a row block
  const std::vector<int32_t> row_of = row_lists(N, K, 5);
  std::vector<int32_t> token(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) token[row_of[i]] = static_cast<int32_t>(i / K);
  const IdPair rows_of(row_of), tokens(token);

  Pair x(randn(N * C, 1)), gathered(fvec(R * C));
  GK().gather_rows(x.g(), tokens.g(), gathered.g(), R, C);
  CK().gather_rows(x.c(), tokens.c(), gathered.c(), R, C);
  CHECK(bitwise_equal(gathered));

  Pair rows(randn(R * C, 2)), weight(randn(R, 3)), y(randn(N * C, 4)), acc(randn(N * C, 5));
  GK().combine_rows(rows.g(), rows_of.g(), weight.g(), y.g(), N, K, C, false);  // y's old values ignored
  CK().combine_rows(rows.c(), rows_of.c(), weight.c(), y.c(), N, K, C, false);
  CHECK(norm_err(y) <= 1e-6);
  GK().combine_rows(rows.g(), rows_of.g(), nullptr, acc.g(), N, K, C, true);  // plain sums in the CPU's order
  CK().combine_rows(rows.c(), rows_of.c(), nullptr, acc.c(), N, K, C, true);
  CHECK(bitwise_equal(acc));
  {  // closed form of one element: token 7, column 11
    const auto r = rows.cpu.to_vector(), w = weight.cpu.to_vector(), got = y.gpu.to_vector();
    double want = 0;
    for (int64_t j = 0; j < K; ++j) want += static_cast<double>(w[7 * K + j]) * r[row_of[7 * K + j] * C + 11];
    CHECK(std::fabs(got[7 * C + 11] - want) <= 1e-5 * (1 + std::fabs(want)));
  }

  Pair dy(randn(N * C, 6)), row_weight(randn(R, 7)), drows(fvec(R * C)), dweight(fvec(R));
  GK().combine_rows_backward(dy.g(), tokens.g(), row_weight.g(), rows.g(), drows.g(), dweight.g(), R, C);
  CK().combine_rows_backward(dy.c(), tokens.c(), row_weight.c(), rows.c(), drows.c(), dweight.c(), R, C);
  CHECK(bitwise_equal(drows));      // one product per element
  CHECK(norm_err(dweight) <= 1e-6);  // f64 dots, rounded once

  Pair xs(randn(N * C, 8)), gate(randn(N, 9, 2.0f)), ys(randn(N * C, 10)), dx(fvec(N * C)), dlogit(fvec(N));
  GK().gated_add_rows(xs.g(), gate.g(), ys.g(), N, C);
  CK().gated_add_rows(xs.c(), gate.c(), ys.c(), N, C);
  CHECK(norm_err(gate) <= 1e-6);  // the logits became the gates
  CHECK(norm_err(ys) <= 1e-6);
  GK().gated_add_rows_backward(dy.g(), xs.g(), gate.g(), dx.g(), dlogit.g(), N, C);
  CK().gated_add_rows_backward(dy.c(), xs.c(), gate.c(), dx.c(), dlogit.c(), N, C);
  CHECK(norm_err(dx) <= 1e-6);
  CHECK(norm_err(dlogit) <= 1e-5);
}

TEST_CASE("cuda: moe_feed_forward routes every token to the CPU's experts", "[cuda][moe]") {
  REQUIRE_GPU();
  const int64_t N = 96, C = 32, E = 6, I = 24;
  auto make = [&](Device dev) {
    std::vector<SwigluWeights> experts;
    for (int64_t e = 0; e < E; ++e)
      experts.push_back({Tensor::from_vector(randn(I * C, 20 + 3 * e, 0.2f), {I, C}, dev),
                         Tensor::from_vector(randn(I * C, 21 + 3 * e, 0.2f), {I, C}, dev),
                         Tensor::from_vector(randn(C * I, 22 + 3 * e, 0.2f), {C, I}, dev)});
    return experts;
  };
  MoeOptions opt;
  opt.top_k = 2;
  MoeRouting cpu, gpu;
  const Tensor x = Tensor::from_vector(randn(N * C, 11), {N, C}), router = Tensor::from_vector(randn(E * C, 12), {E, C});
  const Tensor y_cpu = moe_feed_forward(x, router, make(Device::CPU), {}, {}, opt, &cpu);
  const Tensor y_gpu =
      moe_feed_forward(x.to(Device::CUDA), router.to(Device::CUDA), make(Device::CUDA), {}, {}, opt, &gpu);
  CHECK(y_gpu.device() == Device::CUDA);
  CHECK(gpu.tokens_per_expert == cpu.tokens_per_expert);
  CHECK(std::fabs(gpu.aux_loss - cpu.aux_loss) <= 1e-6 * cpu.aux_loss);
  CHECK(std::fabs(gpu.z_loss - cpu.z_loss) <= 1e-5 * cpu.z_loss);
  CHECK(norm_err(y_gpu.to_vector(), y_cpu.to_vector()) <= 1e-5);
}

TEST_CASE("cuda: moe_feed_forward with experts that get no tokens: the CPU's outputs and gradients, zeros for them",
          "[cuda][moe]") {
  REQUIRE_GPU();
  const int64_t N = 3, C = 16, E = 8, I = 8;  // top 1 of 8 for 3 tokens: at least 5 experts get none
  struct Run {
    std::vector<float> y;
    std::vector<std::vector<float>> grads;  // x, the router, then each expert's gate, up, down
  };
  auto run = [&](Device dev) {
    std::vector<Tensor> leaves{Tensor::from_vector(randn(N * C, 30), {N, C}, dev),
                               Tensor::from_vector(randn(E * C, 31), {E, C}, dev)};
    std::vector<SwigluWeights> experts;
    for (int64_t e = 0; e < E; ++e) {
      experts.push_back({Tensor::from_vector(randn(I * C, 40 + 3 * e, 0.3f), {I, C}, dev),
                         Tensor::from_vector(randn(I * C, 41 + 3 * e, 0.3f), {I, C}, dev),
                         Tensor::from_vector(randn(C * I, 42 + 3 * e, 0.3f), {C, I}, dev)});
      leaves.insert(leaves.end(), {experts.back().gate, experts.back().up, experts.back().down});
    }
    for (Tensor& t : leaves) t.set_requires_grad(true);
    MoeOptions opt;
    opt.top_k = 1;
    opt.aux_loss_weight = 0.1;
    const Tensor y = moe_feed_forward(leaves[0], leaves[1], experts, {}, {}, opt);
    backward(y, Tensor::from_vector(randn(N * C, 32), {N, C}, dev));
    Run r{y.to_vector(), {}};
    for (const Tensor& t : leaves) {
      REQUIRE(t.grad().defined());
      r.grads.push_back(t.grad().to_vector());
    }
    return r;
  };
  const Run cpu = run(Device::CPU), gpu = run(Device::CUDA);
  CHECK(norm_err(gpu.y, cpu.y) <= 1e-5);
  int empty = 0;
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    INFO("gradient of leaf " << i);
    const bool zero = std::all_of(cpu.grads[i].begin(), cpu.grads[i].end(), [](float v) { return v == 0.0f; });
    if (zero) {
      ++empty;
      CHECK(std::all_of(gpu.grads[i].begin(), gpu.grads[i].end(), [](float v) { return v == 0.0f; }));
    } else {
      CHECK(norm_err(gpu.grads[i], cpu.grads[i]) <= 1e-4);
    }
  }
  CHECK(empty >= 5 * 3);  // the matrices of the experts without tokens
}
