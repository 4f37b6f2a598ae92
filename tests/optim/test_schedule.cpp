// LR schedules at known points; clipping coefficient; sum of squares and scaling helpers.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <omp.h>
#include <stdexcept>
#include <vector>

#include "optim/clip.h"
#include "optim/schedule.h"
#include "test_helpers.h"

using namespace mfsdp;

TEST_CASE("LR schedule: warmup then cosine to the floor", "[schedule]") {
  LRSchedule s{.warmup_steps = 10, .total_steps = 110, .kind = DecayKind::cosine, .floor = 0.1};
  CHECK(s.multiplier(0) == Approx(0.1));
  CHECK(s.multiplier(4) == Approx(0.5));
  CHECK(s.multiplier(9) == Approx(1.0));
  CHECK(s.multiplier(10) == Approx(1.0));
  CHECK(s.multiplier(35) == Approx(0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi / 4))));
  CHECK(s.multiplier(60) == Approx(0.55));
  CHECK(s.multiplier(109) == Approx(0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi * 0.99))));
  CHECK(s.multiplier(110) == Approx(0.1));
  CHECK(s.multiplier(5000) == Approx(0.1));
  // Monotone non-increasing after warmup.
  for (int64_t t = 10; t < 120; ++t) REQUIRE(s.multiplier(t + 1) <= s.multiplier(t) + 1e-15);
}

TEST_CASE("LR schedule: linear, constant, no warmup", "[schedule]") {
  LRSchedule lin{.warmup_steps = 10, .total_steps = 110, .kind = DecayKind::linear, .floor = 0.1};
  CHECK(lin.multiplier(35) == Approx(0.775));
  CHECK(lin.multiplier(60) == Approx(0.55));
  CHECK(lin.multiplier(110) == Approx(0.1));
  LRSchedule cst{.warmup_steps = 4, .total_steps = 50, .kind = DecayKind::constant};
  CHECK(cst.multiplier(0) == Approx(0.25));
  CHECK(cst.multiplier(3) == Approx(1.0));
  CHECK(cst.multiplier(49) == 1.0);
  CHECK(cst.multiplier(500) == 1.0);
  LRSchedule cos0{.warmup_steps = 0, .total_steps = 100, .kind = DecayKind::cosine, .floor = 0.0};
  CHECK(cos0.multiplier(0) == 1.0);
  CHECK(cos0.multiplier(50) == Approx(0.5));
}

TEST_CASE("LR schedule: warmup-stable-decay", "[schedule]") {
  LRSchedule s{.warmup_steps = 10, .total_steps = 100, .kind = DecayKind::wsd, .floor = 0.0, .decay_fraction = 0.2};
  CHECK(s.multiplier(4) == Approx(0.5));
  CHECK(s.multiplier(10) == 1.0);
  CHECK(s.multiplier(50) == 1.0);
  CHECK(s.multiplier(79) == 1.0);
  CHECK(s.multiplier(80) == Approx(1.0));
  CHECK(s.multiplier(90) == Approx(0.5));
  CHECK(s.multiplier(99) == Approx(0.05));
  CHECK(s.multiplier(100) == Approx(0.0).margin(1e-15));
  s.floor = 0.2;
  CHECK(s.multiplier(90) == Approx(0.6));
  // Decay longer than the post-warmup span starts right after warmup.
  LRSchedule w{.warmup_steps = 10, .total_steps = 20, .kind = DecayKind::wsd, .floor = 0.0, .decay_fraction = 0.9};
  CHECK(w.multiplier(10) == Approx(1.0));
  CHECK(w.multiplier(15) == Approx(0.5));
}

TEST_CASE("LR schedule: names and validation", "[schedule]") {
  for (DecayKind k : {DecayKind::constant, DecayKind::cosine, DecayKind::linear, DecayKind::wsd})
    CHECK(parse_decay_kind(decay_kind_name(k)) == k);
  CHECK_THROWS_WITH(parse_decay_kind("exp"), Catch::Contains("exp"));
  LRSchedule s;
  CHECK_THROWS_WITH(s.multiplier(-1), Catch::Contains("step -1"));
  s.total_steps = 0;
  CHECK_THROWS_WITH(s.multiplier(0), Catch::Contains("total_steps"));
  s = LRSchedule{};
  s.floor = 1.5;
  CHECK_THROWS_WITH(s.validate(), Catch::Contains("floor"));
  s = LRSchedule{};
  s.decay_fraction = -0.1;
  CHECK_THROWS_WITH(s.validate(), Catch::Contains("decay_fraction"));
}

TEST_CASE("clip_coefficient", "[clip]") {
  CHECK(clip_coefficient(5.0, 1.0) == Approx(1.0 / (5.0 + 1e-6)).epsilon(1e-15));
  CHECK(clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(clip_coefficient(0.0, 1.0) == 1.0);
  CHECK(clip_coefficient(1e9, 0.0) == 1.0);   // disabled
  CHECK(clip_coefficient(1e9, -1.0) == 1.0);  // disabled
  CHECK(clip_coefficient(std::nan(""), 0.0) == 1.0);
  CHECK_THROWS_WITH(clip_coefficient(std::nan(""), 1.0), Catch::Contains("not finite"));
  CHECK_THROWS_AS(clip_coefficient(INFINITY, 1.0), std::invalid_argument);
}

TEST_CASE("sum_of_squares_cpu", "[clip]") {
  const int64_t n = 100000;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i + 1);
  // Integers: every partial sum is exact in f64, so the result is exactly n(n+1)(2n+1)/6.
  CHECK(sum_of_squares_cpu(x.data(), n) == static_cast<double>(n) * (n + 1) * (2 * n + 1) / 6);
  CHECK(sum_of_squares_cpu(x.data(), 0) == 0.0);
  CHECK(sum_of_squares_cpu(x.data(), 3) == 14.0);

  const auto r = mfsdp::test::randn(300001, 17);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double s1 = sum_of_squares_cpu(r.data(), 300001);
  omp_set_num_threads(2);
  const double s2 = sum_of_squares_cpu(r.data(), 300001);
  omp_set_num_threads(saved);
  CHECK(s1 == s2);  // bitwise: fixed chunks, fixed combination order
  double naive = 0.0;
  for (float v : r) naive += static_cast<double>(v) * v;
  CHECK(s1 == Approx(naive).epsilon(1e-12));

  CHECK_THROWS_AS(sum_of_squares_cpu(x.data(), -5), std::invalid_argument);
}
