// Muon numerics: Newton-Schulz singular values, transpose path, zero
// gradient, exact weight decay, scale values, momentum / Nesterov closed forms, split QKV, call counts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <omp.h>
#include <stdexcept>
#include <utility>
#include <vector>

#include "optim/muon.h"
#include "test_helpers.h"

using namespace mfsdp;
using mfsdp::test::randn;
using mfsdp::test::RowMatD;
using mfsdp::test::same_bits;
using mfsdp::test::singular_values;
using mfsdp::test::with_threads;

namespace {

/// Straightforward f64 Newton-Schulz written from the formula (independent of the Eigen kernel).
RowMatD newton_schulz_reference(const std::vector<float>& g, int64_t rows, int64_t cols, int steps) {
  RowMatD x = Eigen::Map<const mfsdp::test::RowMatF>(g.data(), rows, cols).cast<double>();
  double ss = 0.0;
  for (int64_t i = 0; i < x.size(); ++i) ss += x.data()[i] * x.data()[i];
  x /= (std::sqrt(ss) + 1e-7);
  const bool t = rows > cols;
  if (t) x.transposeInPlace();
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  for (int s = 0; s < steps; ++s) {
    RowMatD A(x.rows(), x.rows());
    for (int64_t i = 0; i < x.rows(); ++i)
      for (int64_t j = 0; j < x.rows(); ++j) {
        double acc = 0.0;
        for (int64_t k = 0; k < x.cols(); ++k) acc += x(i, k) * x(j, k);
        A(i, j) = acc;
      }
    RowMatD B = b * A + c * (A * A);
    x = (a * x + B * x).eval();
  }
  if (t) x.transposeInPlace();
  return x;
}

double max_abs_diff(const float* a, const double* b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("newton_schulz_cpu matches an f64 reference, wide and tall", "[muon]") {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{24, 40}, {40, 24}, {17, 17}}) {
    const auto g = randn(rows * cols, 11 + static_cast<uint32_t>(rows));
    std::vector<float> out(g.size());
    newton_schulz_cpu(g.data(), out.data(), rows, cols, 5);
    const RowMatD ref = newton_schulz_reference(g, rows, cols, 5);
    INFO("shape " << rows << "x" << cols);
    CHECK(max_abs_diff(out.data(), ref.data(), rows * cols) < 2e-5);
    // The iterate changed: NS(G) is not just G normalized (entries of NS are O(1/sqrt(cols)) sized).
    CHECK(ref.norm() > 3.0);
  }
}

TEST_CASE("newton_schulz_cpu singular values of 3072x768 and 768x3072 lie in [0.6, 1.25]", "[muon]") {
  const int64_t big = 3072, small = 768;
  const auto g = randn(big * small, 2024);
  std::vector<float> tall(g.size()), wide(g.size());
  newton_schulz_cpu(g.data(), tall.data(), big, small, 5);   // g viewed as 3072 x 768
  newton_schulz_cpu(g.data(), wide.data(), small, big, 5);   // g viewed as 768 x 3072
  for (const auto* o : {&tall, &wide}) {
    const bool is_tall = o == &tall;
    const Eigen::VectorXd sv = is_tall ? singular_values(o->data(), big, small) : singular_values(o->data(), small, big);
    INFO((is_tall ? "3072x768" : "768x3072") << ": min " << sv.minCoeff() << " max " << sv.maxCoeff());
    REQUIRE(sv.size() == small);
    CHECK(sv.minCoeff() >= 0.6);
    CHECK(sv.maxCoeff() <= 1.25);
    // Not collapsed onto one value either: the quintic leaves a spread (fp32 reference 0.68..1.13).
    CHECK(sv.maxCoeff() - sv.minCoeff() > 0.05);
  }
}

TEST_CASE("newton_schulz_cpu transpose path: NS(G^T) == NS(G)^T", "[muon]") {
  const int64_t r = 96, c = 160;
  const auto g = randn(r * c, 7);
  std::vector<float> gt(g.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) gt[j * r + i] = g[i * c + j];
  std::vector<float> o(g.size()), ot(g.size());
  newton_schulz_cpu(g.data(), o.data(), r, c, 5);
  newton_schulz_cpu(gt.data(), ot.data(), c, r, 5);
  double worst = 0.0;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) worst = std::max(worst, double(std::abs(o[i * c + j] - ot[j * r + i])));
  CHECK(worst < 1e-5);
}

TEST_CASE("newton_schulz_cpu square input: singular values >= 5% of the largest land in [0.6, 1.25]", "[muon]") {
  const int64_t n = 256;
  const auto g = randn(n * n, 99);
  std::vector<float> o(g.size());
  newton_schulz_cpu(g.data(), o.data(), n, n, 5);
  // NS acts on singular values only: U^T O V is diagonal with the mapped values, in G's order.
  RowMatD gd = Eigen::Map<const mfsdp::test::RowMatF>(g.data(), n, n).cast<double>();
  Eigen::BDCSVD<RowMatD> svd(gd, Eigen::ComputeFullU | Eigen::ComputeFullV);
  RowMatD od = Eigen::Map<const mfsdp::test::RowMatF>(o.data(), n, n).cast<double>();
  RowMatD d = svd.matrixU().transpose() * od * svd.matrixV();
  const Eigen::VectorXd s = svd.singularValues();
  int checked = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (s(i) < 0.05 * s(0)) continue;
    ++checked;
    INFO("sigma_" << i << " = " << s(i) << " -> " << d(i, i));
    CHECK(d(i, i) >= 0.6);
    CHECK(d(i, i) <= 1.25);
  }
  CHECK(checked > n / 2);
  RowMatD off = d;
  off.diagonal().setZero();
  CHECK(off.cwiseAbs().maxCoeff() < 1e-3);
  // And the whole output's singular values stay bounded (small sigmas map below 0.6, never above).
  CHECK(singular_values(o.data(), n, n).maxCoeff() <= 1.25);
}

TEST_CASE("newton_schulz_cpu leaves the input alone, is deterministic, zero stays zero", "[muon]") {
  const int64_t r = 64, c = 48;
  const auto g = randn(r * c, 5);
  const auto g_copy = g;
  std::vector<float> o1(g.size()), o2(g.size());
  newton_schulz_cpu(g.data(), o1.data(), r, c, 5);
  newton_schulz_cpu(g.data(), o2.data(), r, c, 5);
  CHECK(g == g_copy);
  CHECK(o1 == o2);

  std::vector<float> in_place = g;  // out == G is allowed
  newton_schulz_cpu(in_place.data(), in_place.data(), r, c, 5);
  CHECK(in_place == o1);

  std::vector<float> zero(g.size(), 0.0f), oz(g.size(), 123.0f);
  newton_schulz_cpu(zero.data(), oz.data(), r, c, 5);
  for (float v : oz) REQUIRE(v == 0.0f);

  // Scale invariance (up to the 1e-7 in the norm): NS(100 G) == NS(G).
  std::vector<float> g100(g), o100(g.size());
  for (auto& v : g100) v *= 100.0f;
  newton_schulz_cpu(g100.data(), o100.data(), r, c, 5);
  for (size_t i = 0; i < o1.size(); ++i) REQUIRE(o100[i] == Approx(o1[i]).margin(1e-5));

  CHECK_THROWS_AS(newton_schulz_cpu(g.data(), o1.data(), -1, c, 5), std::invalid_argument);
  CHECK_THROWS_AS(newton_schulz_cpu(g.data(), o1.data(), r, c, -1), std::invalid_argument);
  CHECK_THROWS_AS(newton_schulz_cpu(nullptr, o1.data(), r, c, 5), std::invalid_argument);
}

TEST_CASE("newton_schulz_cpu result is bitwise independent of the OpenMP thread count", "[muon]") {
  // 300x500: 2 symmetric bands, 2 column bands. 2304x768 (GPT-2's c_attn, transposed path): m = 768
  // gives 6 bands of X X^T and A A and 12 column bands of B X. 768x768: 6 and 4 bands.
  for (auto [r, c] : {std::pair<int64_t, int64_t>{300, 500}, {2304, 768}, {768, 768}}) {
    const auto g = randn(r * c, 31 + static_cast<uint32_t>(r));
    std::vector<float> o1(g.size()), o2(g.size()), o3(g.size()), o_eigen2(g.size());
    with_threads(1, 0, [&] { newton_schulz_cpu(g.data(), o1.data(), r, c, 5); });
    with_threads(2, 0, [&] { newton_schulz_cpu(g.data(), o2.data(), r, c, 5); });
    with_threads(3, 0, [&] { newton_schulz_cpu(g.data(), o3.data(), r, c, 5); });  // oversubscribed
    // One OpenMP thread while Eigen is told 2 (a team of one with Eigen::nbThreads() > 1): Eigen's
    // product expression would split its GEMMs here; the bands' serial GEMMs must not.
    with_threads(1, 2, [&] { newton_schulz_cpu(g.data(), o_eigen2.data(), r, c, 5); });
    INFO("shape " << r << "x" << c);
    CHECK(same_bits(o1, o2));
    CHECK(same_bits(o1, o3));
    CHECK(same_bits(o1, o_eigen2));
    bool finite = true;
    for (float v : o1) finite = finite && std::isfinite(v);
    CHECK(finite);
  }
}

TEST_CASE("muon_step_cpu (split QKV) is bitwise independent of the OpenMP thread count", "[muon]") {
  const int64_t r = 3 * 256, c = 320;  // three 256x320 blocks; 245760 elements (threaded elementwise loops)
  const auto w0 = randn(r * c, 41), g = randn(r * c, 42), m0 = randn(r * c, 43, 0.1f);
  MuonOptions opt;
  opt.split_qkv = true;
  opt.weight_decay = 0.1;
  auto run = [&](int threads) {
    std::vector<float> w = w0, m = m0;
    with_threads(threads, 0, [&] {
      for (int step = 0; step < 2; ++step) muon_step_cpu(w.data(), g.data(), m.data(), r, c, 0.02, opt, 3);
    });
    return std::pair{w, m};
  };
  const auto [w1, m1] = run(1);
  const auto [w2, m2] = run(2);
  CHECK(same_bits(w1, w2));
  CHECK(same_bits(m1, m2));
  CHECK(!same_bits(w1, w0));
}

// Timing of Newton-Schulz (5 steps) on one GPT-2 124M layer's Muon matrices ([fan_out, fan_in]:
// c_attn 2304x768 whole or as 3 blocks of 768x768, attn c_proj 768x768, mlp c_fc 3072x768, mlp
// c_proj 768x3072), at 1 and 2 OpenMP threads (MFSDP_NS_BENCH_THREADS="1,2,4" overrides). Hidden:
// run with `test_optim "[.bench]"`; scripts/bench_newton_schulz.py parses the `ns_bench` lines.
TEST_CASE("bench: newton_schulz_cpu on GPT-2 124M's Muon matrices", "[.bench][muon]") {
  std::vector<int> thread_counts = {1, 2};
  if (const char* env = std::getenv("MFSDP_NS_BENCH_THREADS")) {
    thread_counts.clear();
    for (const char* p = env; *p;) {
      char* end = nullptr;
      const long t = std::strtol(p, &end, 10);
      if (end == p) break;
      if (t > 0) thread_counts.push_back(static_cast<int>(t));
      p = *end ? end + 1 : end;
    }
  }
  int reps = 3;
  if (const char* env = std::getenv("MFSDP_NS_BENCH_REPS")) reps = std::max(1, std::atoi(env));
  const int layers = 12;
  for (int split = 0; split <= 1; ++split) {
    std::vector<std::pair<int64_t, int64_t>> shapes;
    if (split) shapes = {{768, 768}, {768, 768}, {768, 768}};
    else shapes = {{2304, 768}};
    shapes.insert(shapes.end(), {{768, 768}, {3072, 768}, {768, 3072}});
    std::vector<std::vector<float>> gs;
    for (size_t i = 0; i < shapes.size(); ++i)
      gs.push_back(randn(shapes[i].first * shapes[i].second, 500 + static_cast<uint32_t>(i)));
    std::vector<float> out(3072 * 768);
    // Full GEMM FLOPs of one layer (X X^T, A A, B X as general products; the kernel computes the
    // symmetric ones as triangles, so it does ~ 2/3 of these).
    double flops = 0.0;
    for (auto [r, c] : shapes) {
      const double m = static_cast<double>(std::min(r, c)), n = static_cast<double>(std::max(r, c));
      flops += 5.0 * (4.0 * m * m * n + 2.0 * m * m * m);
    }
    for (int t : thread_counts) {
      double best = 1e30, best_cpu = 0.0;
      with_threads(t, 0, [&] {
        for (size_t i = 0; i < shapes.size(); ++i)  // warm-up: scratch, caches
          newton_schulz_cpu(gs[i].data(), out.data(), shapes[i].first, shapes[i].second, 5);
        for (int rep = 0; rep < reps; ++rep) {
          const std::clock_t c0 = std::clock();
          const auto t0 = std::chrono::steady_clock::now();
          for (size_t i = 0; i < shapes.size(); ++i)
            newton_schulz_cpu(gs[i].data(), out.data(), shapes[i].first, shapes[i].second, 5);
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (s < best) {
            best = s;
            best_cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
          }
        }
      });
      std::printf("ns_bench threads=%d split_qkv=%d layer_s=%.4f gpt2_124m_s=%.3f cpu_s=%.4f gflops=%.1f\n", t,
                  split, best, best * layers, best_cpu, flops / best / 1e9);
    }
  }
  std::fflush(stdout);
}

TEST_CASE("muon_scale exact values", "[muon]") {
  CHECK(muon_scale(3072, 768, MuonScaleRule::original) == 2.0);
  CHECK(muon_scale(768, 3072, MuonScaleRule::original) == 1.0);
  CHECK(muon_scale(768, 768, MuonScaleRule::original) == 1.0);
  CHECK(muon_scale(3072, 768, MuonScaleRule::match_rms_adamw) == Approx(0.2 * std::sqrt(3072.0)).epsilon(1e-15));
  CHECK(muon_scale(768, 3072, MuonScaleRule::match_rms_adamw) == Approx(0.2 * std::sqrt(3072.0)).epsilon(1e-15));
  CHECK(muon_scale(2304, 768, MuonScaleRule::original) == Approx(std::sqrt(3.0)).epsilon(1e-15));
  CHECK_THROWS_AS(muon_scale(0, 3, MuonScaleRule::original), std::invalid_argument);

  CHECK(parse_muon_scale_rule("original") == MuonScaleRule::original);
  CHECK(parse_muon_scale_rule("match_rms_adamw") == MuonScaleRule::match_rms_adamw);
  CHECK(std::string(muon_scale_rule_name(MuonScaleRule::match_rms_adamw)) == "match_rms_adamw");
  CHECK(std::string(muon_scale_rule_name(MuonScaleRule::original)) == "original");
  CHECK_THROWS_WITH(parse_muon_scale_rule("spectral"), Catch::Contains("spectral"));
}

TEST_CASE("muon_step_cpu: zero gradient gives zero update; weight decay is exact", "[muon]") {
  const int64_t r = 48, c = 32;
  const auto w0 = randn(r * c, 1);
  std::vector<float> g(r * c, 0.0f), m(r * c, 0.0f), w = w0;
  MuonOptions opt;
  muon_step_cpu(w.data(), g.data(), m.data(), r, c, 0.02, opt);
  CHECK(w == w0);
  for (float v : m) REQUIRE(v == 0.0f);

  opt.weight_decay = 1.0;
  muon_step_cpu(w.data(), g.data(), m.data(), r, c, 0.1, opt);
  for (size_t i = 0; i < w.size(); ++i) {
    REQUIRE(std::isfinite(w[i]));
    REQUIRE(w[i] == Approx(w0[i] * 0.9).epsilon(1e-6));
  }
}

TEST_CASE("muon_step_cpu closed form with ns_steps = 0 (update = lr*scale*U/||U||)", "[muon]") {
  // With zero Newton-Schulz iterations O = U / (||U||_F + 1e-7), so the whole step has a closed form.
  const int64_t r = 12, c = 4;  // tall: scale sqrt(3) under `original`
  const auto w0 = randn(r * c, 3), g1 = randn(r * c, 4), g2 = randn(r * c, 5);
  for (bool nesterov : {false, true}) {
    MuonOptions opt;
    opt.ns_steps = 0;
    opt.nesterov = nesterov;
    opt.momentum = 0.9;
    opt.weight_decay = 0.5;
    const double lr = 0.05, beta = 0.9, scale = std::sqrt(3.0);
    std::vector<float> w = w0, m(r * c, 0.0f);
    std::vector<double> wr(w0.begin(), w0.end()), mr(r * c, 0.0);
    for (const auto* g : {&g1, &g2}) {
      muon_step_cpu(w.data(), g->data(), m.data(), r, c, lr, opt);
      std::vector<double> u(r * c);
      double ss = 0.0;
      for (int64_t i = 0; i < r * c; ++i) {
        mr[i] = beta * mr[i] + (1 - beta) * (*g)[i];
        u[i] = nesterov ? (1 - beta) * (*g)[i] + beta * mr[i] : mr[i];
        ss += u[i] * u[i];
      }
      for (int64_t i = 0; i < r * c; ++i)
        wr[i] = wr[i] * (1 - lr * 0.5) - lr * scale * u[i] / (std::sqrt(ss) + 1e-7);
    }
    INFO("nesterov " << nesterov);
    for (int64_t i = 0; i < r * c; ++i) {
      REQUIRE(m[i] == Approx(mr[i]).margin(1e-6));
      REQUIRE(w[i] == Approx(wr[i]).margin(1e-6));
    }
  }
}

TEST_CASE("muon_step_cpu: momentum after one step (Nesterov off) is (1-beta)*grad", "[muon]") {
  const int64_t r = 64, c = 96;
  const auto w0 = randn(r * c, 8), g = randn(r * c, 9);
  std::vector<float> w = w0, m(r * c, 0.0f);
  MuonOptions opt;
  opt.nesterov = false;
  const double lr = 0.01;
  muon_step_cpu(w.data(), g.data(), m.data(), r, c, lr, opt);
  for (int64_t i = 0; i < r * c; ++i) REQUIRE(m[i] == Approx((1.0 - 0.95) * g[i]).epsilon(1e-6));
  // The applied update is NS(M) = NS(G) (scale invariance), scale 1 for a wide matrix.
  std::vector<float> o(r * c);
  newton_schulz_cpu(g.data(), o.data(), r, c, 5);
  for (int64_t i = 0; i < r * c; ++i) REQUIRE(w0[i] - w[i] == Approx(lr * o[i]).margin(1e-6));
}

TEST_CASE("muon_step_cpu split_qkv: three Newton-Schulz calls, each block orthogonal", "[muon]") {
  const int64_t block = 128, c = 64, r = 3 * block;  // blocks 128x64 (scale sqrt(2)); whole 384x64 would be sqrt(6)
  const auto w0 = randn(r * c, 21), g = randn(r * c, 22);
  MuonOptions opt;
  opt.split_qkv = true;
  const double lr = 0.01;

  std::vector<float> w = w0, m(r * c, 0.0f);
  reset_newton_schulz_call_count();
  muon_step_cpu(w.data(), g.data(), m.data(), r, c, lr, opt, 3);
  CHECK(newton_schulz_call_count() == 3);

  const double scale = std::sqrt(2.0);
  std::vector<float> o(r * c);
  for (int64_t i = 0; i < r * c; ++i) o[i] = static_cast<float>((w0[i] - w[i]) / (lr * scale));
  for (int b = 0; b < 3; ++b) {
    const Eigen::VectorXd sv = singular_values(o.data() + b * block * c, block, c);
    INFO("block " << b << " sv in [" << sv.minCoeff() << ", " << sv.maxCoeff() << "]");
    CHECK(sv.minCoeff() >= 0.6);
    CHECK(sv.maxCoeff() <= 1.25);
  }
  // Stacked, the three orthogonal blocks are not orthogonal: O^T O ~ 3 I, singular values ~ sqrt(3).
  CHECK(singular_values(o.data(), r, c).minCoeff() > 1.2);

  // Without split (or with qkv_blocks 1) the same matrix costs one call.
  opt.split_qkv = false;
  w = w0;
  std::fill(m.begin(), m.end(), 0.0f);
  reset_newton_schulz_call_count();
  muon_step_cpu(w.data(), g.data(), m.data(), r, c, lr, opt, 3);
  opt.split_qkv = true;
  muon_step_cpu(w.data(), g.data(), m.data(), r, c, lr, opt, 1);
  CHECK(newton_schulz_call_count() == 2);

  CHECK_THROWS_WITH(muon_step_cpu(w.data(), g.data(), m.data(), 10, c, lr, opt, 3),
                    Catch::Contains("not divisible"));
  CHECK_THROWS_AS(muon_step_cpu(w.data(), g.data(), m.data(), r, c, lr, opt, 0), std::invalid_argument);
}

TEST_CASE("newton_schulz_call_count == steps x matrices", "[muon]") {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{32, 16}, {16, 48}, {20, 20}};
  std::vector<std::vector<float>> w, g, m;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const int64_t n = shapes[k].first * shapes[k].second;
    w.push_back(randn(n, 100 + k));
    g.push_back(randn(n, 200 + k));
    m.emplace_back(n, 0.0f);
  }
  reset_newton_schulz_call_count();
  const int steps = 4;
  for (int s = 0; s < steps; ++s)
    for (size_t k = 0; k < shapes.size(); ++k)
      muon_step_cpu(w[k].data(), g[k].data(), m[k].data(), shapes[k].first, shapes[k].second, 0.02, MuonOptions{});
  CHECK(newton_schulz_call_count() == steps * static_cast<int64_t>(shapes.size()));
  reset_newton_schulz_call_count();
  CHECK(newton_schulz_call_count() == 0);
}

TEST_CASE("muon_step_cpu rejects bad options", "[muon]") {
  std::vector<float> w(16), g(16), m(16);
  MuonOptions opt;
  opt.momentum = 1.0;
  CHECK_THROWS_WITH(muon_step_cpu(w.data(), g.data(), m.data(), 4, 4, 0.1, opt), Catch::Contains("momentum"));
  opt = MuonOptions{};
  opt.ns_steps = -2;
  CHECK_THROWS_WITH(muon_step_cpu(w.data(), g.data(), m.data(), 4, 4, 0.1, opt), Catch::Contains("ns_steps"));
  opt = MuonOptions{};
  CHECK_THROWS_AS(muon_step_cpu(w.data(), g.data(), m.data(), 0, 4, 0.1, opt), std::invalid_argument);
  CHECK_THROWS_AS(muon_step_cpu(w.data(), g.data(), m.data(), 4, 4, std::nan(""), opt), std::invalid_argument);
}
