// ns_dtype bf16: the quintic orthogonalizers (newton_schulz5, polar_express) with bf16 products
// and f32 accumulation, against the f32 path; determinism; gram_newton_schulz refuses bf16.
//
// The bound, and where it comes from (5 steps). bf16 keeps 8 significant bits: rounding an
// operand changes it by a relative u = 2^-9 at most (round to nearest). Each step rounds X, A and
// B (A = X X^T, B = b A + c A^2, X' = a X + B X); the products accumulate in f32 (exact bf16 x bf16
// products, f32 sums), so the step's error is the operand rounding: about 3u relative on the B X
// term, whose size is at most (|b| ||A|| + |c| ||A||^2) ||X|| ~ 6.8 * 1.3 ||X|| for newton_schulz5
// on its band (||A||_2 <= ~1.3). Aligned worst case: ~3u * 9 ~ 27u per step; the roundings are
// independent with zero mean, so in the Frobenius norm over m n entries the per-step effect is
// ~sqrt(3) u * 9 / sqrt(3) = 9u, and the next steps carry it with |p'(sigma)| <= ~1.1 on the band
// (the iteration neither contracts nor amplifies it there). Five steps summed: 45u = 0.088, the
// asserted relative Frobenius difference from the f32 result (measured 0.008 .. 0.038 on AVX512-BF16,
// largest for polar_express, whose first step has |b| + |c| = 38 but acts on a small X).
// Orthogonality: the bf16 result's singular values (of inputs with sigma >= 5% sigma_max) stay in
// the f32 method's band widened by the same 45u: newton_schulz5 [0.675, 1.21] -> [0.587, 1.298],
// polar_express [0.85, 1.145] -> [0.762, 1.233]. Determinism: the same call twice gives the same
// bits (fixed thread count and ISA; the bf16 GEMM's bits may depend on both).
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim/muon.h"
#include "optim/orthogonalize.h"
#include "ortho_cases.h"
#include "test_helpers.h"

using namespace mfsdp;
using namespace mfsdp::test;

namespace {

constexpr double kBf16Unit = 1.0 / 512.0;  // 2^-9
constexpr double kRelBound = 45.0 * kBf16Unit;

std::vector<float> ortho(const std::vector<float>& g, int64_t r, int64_t c, Orthogonalizer m, NsDType d) {
  std::vector<float> out(g.size());
  orthogonalize_cpu(g.data(), out.data(), r, c, 5, m, d);
  return out;
}

double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace

TEST_CASE("parse_ns_dtype / ns_dtype_name round trip; bad names are named", "[orthogonalize][bf16]") {
  CHECK(parse_ns_dtype("f32") == NsDType::f32);
  CHECK(parse_ns_dtype("bf16") == NsDType::bf16);
  CHECK(std::string(ns_dtype_name(NsDType::bf16)) == "bf16");
  try {
    parse_ns_dtype("fp16");
    FAIL("fp16 accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("fp16") != std::string::npos);
  }
}

TEST_CASE("bf16 Newton-Schulz is within 45 * 2^-9 of f32, in the band, deterministic", "[orthogonalize][bf16]") {
  std::vector<OrthoCase> cases;
  for (auto [r, c] : {std::pair<int64_t, int64_t>{64, 64}, {48, 96}, {96, 48}, {128, 512}, {300, 200}}) {
    cases.push_back(random_case(r, c, 11 + static_cast<uint32_t>(r)));
    cases.push_back(ill_conditioned_case(r, c, 1e-3, 21 + static_cast<uint32_t>(r)));
  }
  for (const OrthoCase& c : cases) {
    for (Orthogonalizer m : {Orthogonalizer::newton_schulz5, Orthogonalizer::polar_express}) {
      INFO(orthogonalizer_name(m) << " on " << c.name);
      const auto f32 = ortho(c.g, c.rows, c.cols, m, NsDType::f32);
      const auto bf = ortho(c.g, c.rows, c.cols, m, NsDType::bf16);
      const double rel = relative_diff(bf, f32);
      INFO("relative difference " << rel);
      CHECK(rel < kRelBound);
      CHECK(same_bits(bf, ortho(c.g, c.rows, c.cols, m, NsDType::bf16)));  // same bits twice
      const Eigen::VectorXd sv = singular_values(bf.data(), c.rows, c.cols);
      const bool ns5 = m == Orthogonalizer::newton_schulz5;
      const double lo = (ns5 ? 0.675 : 0.85) - kRelBound, hi = (ns5 ? 1.21 : 1.145) + kRelBound;
      for (Eigen::Index i = 0; i < sv.size(); ++i)
        if (c.sigma(i) >= 0.05 * c.sigma(0)) {
          CHECK(sv(i) >= lo);
          CHECK(sv(i) <= hi);
        }
    }
  }
}

TEST_CASE("bf16 path: batched and strided equal single calls; zero maps to zero", "[orthogonalize][bf16]") {
  const int64_t r = 40, c = 72, n = 3;
  const auto g = randn(n * r * c, 5);
  std::vector<float> strided(g.size());
  orthogonalize_strided_cpu(g.data(), strided.data(), n, r, c, 5, Orthogonalizer::newton_schulz5, NsDType::bf16);
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float> gi(g.begin() + i * r * c, g.begin() + (i + 1) * r * c);
    const std::vector<float> si(strided.begin() + i * r * c, strided.begin() + (i + 1) * r * c);
    CHECK(same_bits(si, ortho(gi, r, c, Orthogonalizer::newton_schulz5, NsDType::bf16)));
  }
  const std::vector<float> zero(static_cast<size_t>(r * c), 0.0f);
  CHECK(same_bits(ortho(zero, r, c, Orthogonalizer::polar_express, NsDType::bf16), zero));
}

TEST_CASE("gram_newton_schulz refuses bf16; muon_step_cpu names ns_dtype", "[orthogonalize][bf16]") {
  std::vector<float> g(16, 1.0f), out(16);
  CHECK_THROWS_AS(orthogonalize_cpu(g.data(), out.data(), 4, 4, 5, Orthogonalizer::gram_newton_schulz, NsDType::bf16),
                  std::invalid_argument);
  MuonOptions opt;
  opt.orthogonalizer = Orthogonalizer::gram_newton_schulz;
  opt.ns_dtype = NsDType::bf16;
  std::vector<float> w(16, 0.5f), mom(16, 0.0f);
  try {
    muon_step_cpu(w.data(), g.data(), mom.data(), 4, 4, 0.01f, opt);
    FAIL("gram_newton_schulz with bf16 accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("ns_dtype") != std::string::npos);
  }
}
