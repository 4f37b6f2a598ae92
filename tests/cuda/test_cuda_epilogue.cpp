// cuBLASLt's fused epilogues (Kernels::gemm_bf16_epilogue: bias, bias + GELU keeping the
// pre-activation, GELU gradient + bias gradient) against the CPU's GEMM followed by its separate
// kernels, on the same bf16 operands.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "cuda_test_util.h"

using namespace mfsdp;
using namespace mfsdp::cuda_test;

namespace {

// cuBLASLt documents its GELU as the tanh approximation, not its accuracy. The MLP rounds gelu(pre)
// to bf16 before the next GEMM (a relative step of 2^-8 to 2^-7, so an error of up to 2^-8 of the value),
// and its gradient dpre feeds bf16 GEMMs the same way. An epilogue whose GELU (or GELU') is within
// 2^-9 of the value plus 2^-10 of the tensor's RMS (for values near zero, where an approximate tanh's
// absolute error dominates) is therefore no further from the f32 kernel than the rounding applied
// next anyway; a wrong formula, index or bias misses by O(1) of the RMS.
constexpr double kGeluRel = 1.0 / 512, kGeluRms = 1.0 / 1024;

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// Every |got - ref| <= rel |ref| + abs; reports the worst element.
void check_within(const std::vector<float>& got, const std::vector<float>& ref, double rel, double abs) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double ratio = std::isnan(err) ? INFINITY : err / (rel * std::fabs(static_cast<double>(ref[i])) + abs);
    if (ratio > 1) ++bad;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  INFO(bad << " of " << ref.size() << " outside; worst at " << worst << ": " << got[worst] << " vs " << ref[worst]
            << " (" << worst_ratio << " of the bound)");
  CHECK(bad == 0);
}

Tensor bf16_randn(int64_t n, uint32_t seed, float stddev = 1.0f) {
  return Tensor::from_vector(randn(n, seed, stddev), {n}).to(DType::bf16);
}

}  // namespace

TEST_CASE("cuda: cuBLASLt epilogues (bias, bias+GELU, GELU gradient + bias gradient) vs the separate kernels",
          "[cuda][gemm][bf16][epilogue]") {
  REQUIRE_GPU();
  using E = Kernels::Epilogue;
  struct Dims { int64_t M, N, K; };
  // a small MLP (rows not a multiple of anything), and GPT-2 124M's c_fc at T = 1024
  for (Dims d : {Dims{74, 192, 48}, Dims{1024, 3072, 768}}) {
    INFO("M=" << d.M << " N=" << d.N << " K=" << d.K);
    const int64_t MN = d.M * d.N;
    const Tensor x = bf16_randn(d.M * d.K, 30), W = bf16_randn(d.N * d.K, 31, 1.0f / std::sqrt(float(d.K)));
    const Tensor xg = x.to(Device::CUDA), Wg = W.to(Device::CUDA);
    Pair bias(randn(d.N, 32, 0.5f));
    // forward, bias only: C = x W^T + b
    Pair C(fvec(MN));
    REQUIRE(GK().gemm_bf16_epilogue(E::bias, false, true, d.M, d.N, d.K, xg.data_ptr(), Wg.data_ptr(), C.g(),
                                    bias.g(), nullptr));
    CK().gemm_bf16(false, true, d.M, d.N, d.K, 1.0f, x.data_ptr(), W.data_ptr(), 0.0f, C.c());
    CK().add_bias(C.c(), bias.c(), d.M, d.N);
    CHECK(norm_err(C) <= 1e-5);  // exact products, f32 sums in another order, the same f32 bias add
    // forward, bias + GELU: aux = pre, C = gelu(pre)
    Pair H(fvec(MN)), pre(fvec(MN));
    REQUIRE(GK().gemm_bf16_epilogue(E::bias_gelu, false, true, d.M, d.N, d.K, xg.data_ptr(), Wg.data_ptr(), H.g(),
                                    bias.g(), pre.g()));
    CHECK(norm_err(pre.gpu.to_vector(), C.cpu.to_vector()) <= 1e-5);
    CK().gelu_forward(C.c(), H.c(), MN);
    const std::vector<float> h_ref = H.cpu.to_vector();
    check_within(H.gpu.to_vector(), h_ref, kGeluRel, kGeluRms * rms(h_ref));
    // backward: dpre = (dy W2) * gelu'(pre) and db = sum over rows of dpre, with dy [M, K2] and
    // W2 [K2, N] (the projection's weight [out, hidden]); pre is the CPU's, on both devices
    const int64_t K2 = d.K;
    const Tensor dy = bf16_randn(d.M * K2, 33), W2 = bf16_randn(K2 * d.N, 34, 1.0f / std::sqrt(float(K2)));
    const Tensor dyg = dy.to(Device::CUDA), W2g = W2.to(Device::CUDA);
    const Tensor pre_ref = C.cpu, pre_g = C.cpu.to(Device::CUDA);
    Pair dpre(fvec(MN)), db(fvec(d.N, 7.0f));
    REQUIRE(GK().gemm_bf16_epilogue(E::dgelu_bgrad, false, false, d.M, d.N, K2, dyg.data_ptr(), W2g.data_ptr(),
                                    dpre.g(), db.g(), pre_g.data_f32()));
    std::vector<float> dh(MN);
    CK().gemm_bf16(false, false, d.M, d.N, K2, 1.0f, dy.data_ptr(), W2.data_ptr(), 0.0f, dh.data());
    CK().fill(dpre.c(), 0.0f, MN);
    CK().gelu_backward(pre_ref.data_f32(), dh.data(), dpre.c(), MN);
    CK().fill(db.c(), 0.0f, d.N);
    CK().bias_grad(db.c(), dpre.c(), d.M, d.N);
    const std::vector<float> dpre_ref = dpre.cpu.to_vector();
    const double dpre_abs = kGeluRms * rms(dpre_ref);
    check_within(dpre.gpu.to_vector(), dpre_ref, kGeluRel, dpre_abs);
    // db (written, not added: the 7s are gone) sums M elements each within that bound: per column,
    // sum over rows of (2^-9 |dpre| + 2^-10 rms), plus f32 reordering of the column sum
    const std::vector<float> db_gpu = db.gpu.to_vector(), db_ref = db.cpu.to_vector();
    for (int64_t c = 0; c < d.N; ++c) {
      double bound = 0, mag = 0;
      for (int64_t r = 0; r < d.M; ++r) {
        bound += kGeluRel * std::fabs(dpre_ref[r * d.N + c]) + dpre_abs;
        mag += std::fabs(dpre_ref[r * d.N + c]);
      }
      INFO("bias gradient column " << c);
      CHECK(std::fabs(static_cast<double>(db_gpu[c]) - db_ref[c]) <= bound + 1e-5 * mag);
    }
    // the same algorithm again gives the same bits (deterministic epilogues)
    Pair dpre2(fvec(MN)), db2(fvec(d.N));
    REQUIRE(GK().gemm_bf16_epilogue(E::dgelu_bgrad, false, false, d.M, d.N, K2, dyg.data_ptr(), W2g.data_ptr(),
                                    dpre2.g(), db2.g(), pre_g.data_f32()));
    CHECK(dpre2.gpu.to_vector() == dpre.gpu.to_vector());
    CHECK(db2.gpu.to_vector() == db_gpu);
  }
  // refused, writing nothing: a bias at a 4-byte offset, and a GELU epilogue with N not a multiple of 8
  const Tensor x = bf16_randn(16 * 32, 40), W = bf16_randn(40 * 32, 41);
  const Tensor xg = x.to(Device::CUDA), Wg = W.to(Device::CUDA);
  Pair C(fvec(16 * 40, 3.0f)), bias(randn(44, 42)), aux(fvec(16 * 40));
  CHECK_FALSE(GK().gemm_bf16_epilogue(E::bias, false, true, 16, 40, 32, xg.data_ptr(), Wg.data_ptr(), C.g(),
                                      bias.g() + 1, nullptr));
  CHECK_FALSE(GK().gemm_bf16_epilogue(E::bias_gelu, false, true, 16, 36, 32, xg.data_ptr(), Wg.data_ptr(), C.g(),
                                      bias.g(), aux.g()));
  CHECK(bitwise_equal(C));
  // the same shape with a bias at a 16-byte offset after one at its allocation's alignment: a plan
  // of its own (the alignment is part of the key; maybe another algorithm, so another summation
  // order), and the aligned call's result up to that order
  Pair C1(fvec(16 * 40)), C2(fvec(16 * 40));
  REQUIRE(GK().gemm_bf16_epilogue(E::bias, false, true, 16, 40, 32, xg.data_ptr(), Wg.data_ptr(), C1.g(), bias.g(),
                                  nullptr));
  Pair shifted(fvec(44));
  CK().fill(shifted.c(), 0.0f, 44);
  const std::vector<float> b40 = bias.cpu.to_vector();
  std::copy(b40.begin(), b40.begin() + 40, shifted.c() + 4);
  shifted.gpu = shifted.cpu.to(Device::CUDA);
  REQUIRE(GK().gemm_bf16_epilogue(E::bias, false, true, 16, 40, 32, xg.data_ptr(), Wg.data_ptr(), C2.g(),
                                  shifted.g() + 4, nullptr));
  CHECK(norm_err(C2.gpu.to_vector(), C1.gpu.to_vector()) <= 1e-5);
  // the CPU backend offers no epilogue: ops fall back to its separate kernels
  CHECK_FALSE(CK().gemm_bf16_epilogue(E::bias, false, true, 16, 40, 32, x.data_ptr(), W.data_ptr(), C.c(),
                                      bias.c(), nullptr));
}
