// The CPU backend's bf16 GEMM (oneDNN's bf16 matmul on AVX512-BF16/AMX, else the f32 SGEMM of the
// widened operands) against a double-precision closed form, for every transpose, alpha and beta.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/cpu_gemm_bf16.h"
#include "runtime/kernels.h"

using namespace mfsdp;

namespace {

std::vector<bf16> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(dist(rng));
  return v;
}

}  // namespace

TEST_CASE("cpu gemm_bf16: bf16 products accumulated in f32, every transpose, alpha and beta", "[kernels][bf16]") {
  INFO(cpu_gemm_bf16_path());
  Kernels& k = kernels(Device::CPU);
  std::mt19937 rng(7);
  struct Shape { int64_t M, N, K; };
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 5, 3}, Shape{33, 17, 130}, Shape{64, 96, 768}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.0f}, std::pair{-2.0f, 0.25f}}) {
        const auto A = random_bf16(s.M * s.K, rng), B = random_bf16(s.K * s.N, rng);
        std::vector<float> C(s.M * s.N), C0(s.M * s.N);
        std::normal_distribution<float> dist;
        for (auto& c : C0) c = dist(rng);
        C = C0;
        k.gemm_bf16(ta, tb, s.M, s.N, s.K, alpha, A.data(), B.data(), beta, C.data());
        // Each product of two bf16 values is exact in f32; only the K additions round (f32 epsilon
        // 2^-24 each, relative to the sum of magnitudes), plus the alpha/beta scaling and the sum.
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t n = 0; n < s.N; ++n) {
            double exact = 0, magnitude = 0;
            for (int64_t i = 0; i < s.K; ++i) {
              const double a = bf16_to_float(A[ta ? i * s.M + m : m * s.K + i]);
              const double b = bf16_to_float(B[tb ? n * s.K + i : i * s.N + n]);
              exact += a * b;
              magnitude += std::fabs(a * b);
            }
            const double want = alpha * exact + beta * double(C0[m * s.N + n]);
            const double bound = (s.K + 3) * std::ldexp(1.0, -24) *
                                 (std::fabs(alpha) * magnitude + std::fabs(beta * double(C0[m * s.N + n])));
            INFO("M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta << " tb=" << tb << " alpha=" << alpha
                      << " beta=" << beta << " at (" << m << "," << n << ")");
            REQUIRE(std::fabs(C[m * s.N + n] - want) <= bound + 1e-30);
          }
      }
    }
  }
}

TEST_CASE("cpu gemm_bf16 is deterministic: the same call twice gives the same bits", "[kernels][bf16]") {
  std::mt19937 rng(9);
  const int64_t M = 128, N = 256, K = 768;
  const auto A = random_bf16(M * K, rng), B = random_bf16(N * K, rng);
  std::vector<float> C1(M * N), C2(M * N);
  kernels(Device::CPU).gemm_bf16(false, true, M, N, K, 1.f, A.data(), B.data(), 0.f, C1.data());
  kernels(Device::CPU).gemm_bf16(false, true, M, N, K, 1.f, A.data(), B.data(), 0.f, C2.data());
  CHECK(C1 == C2);
}
