// ExactSum: exact, order-independent summation. Checked against closed forms (cancellation, ties
// to even, values below the rounding position), against itself under permutation, splitting and
// merging, and against the plain per-element path for f32 squares.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <omp.h>
#include <random>
#include <vector>

#include "optim/clip.h"
#include "optim/exact_sum.h"

using namespace mfsdp;

namespace {
double exact(std::initializer_list<double> xs) {
  ExactSum s;
  for (double x : xs) s.add(x);
  return s.value();
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// Floats spread over every exponent (normals and subnormals), both signs.
std::vector<float> wide_floats(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    uint32_t bits = g();
    if (((bits >> 23) & 0xff) == 0xff) bits &= ~(1u << 30);  // no Inf/NaN
    std::memcpy(&x, &bits, 4);
  }
  return v;
}
}  // namespace

TEST_CASE("exact sums: closed forms a plain f64 sum gets wrong", "[exact_sum]") {
  CHECK(exact({1e16, 1.0, -1e16}) == 1.0);        // f64 left to right gives 0
  CHECK(exact({1.0, 1e100, 1.0, -1e100}) == 2.0);
  CHECK(exact({0x1p53, 1.0}) == 0x1p53);          // a tie rounds to even
  CHECK(exact({0x1p53, 1.0, 0x1p-1000}) == 0x1p53 + 2.0);  // just above the tie rounds up
  CHECK(exact({0x1p53 + 2.0, 1.0}) == 0x1p53 + 4.0);        // a tie rounds to even (upwards)
  CHECK(exact({-3.5, 1.25}) == -2.25);
  CHECK(exact({0x1p-1074, 0x1p-1074}) == 0x1p-1073);       // subnormals are exact
  CHECK(exact({std::numeric_limits<double>::max(), std::numeric_limits<double>::max()}) ==
        std::numeric_limits<double>::infinity());
  CHECK(exact({}) == 0.0);
  CHECK(ExactSum().is_zero());
  ExactSum z;
  z.add(5.0);
  z.add(-5.0);
  CHECK(z.is_zero());
}

TEST_CASE("exact sums: non-finite values propagate like IEEE addition", "[exact_sum]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  CHECK(exact({1.0, inf}) == inf);
  CHECK(exact({1.0, -inf}) == -inf);
  CHECK(std::isnan(exact({inf, -inf})));
  CHECK(std::isnan(exact({1.0, nan})));
  ExactSum s;
  const float fx[3] = {1.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  s.add_squares(fx, 3);
  CHECK(s.value() == inf);  // squares of -Inf are +Inf
  const float fn[2] = {2.0f, std::nanf("")};
  ExactSum t;
  t.add_squares(fn, 2);
  CHECK(std::isnan(t.value()));
}

TEST_CASE("exact sums do not depend on order, split or merge", "[exact_sum]") {
  std::mt19937_64 g(7);
  std::vector<double> v(20000);
  for (double& x : v) {
    const double m = std::ldexp(static_cast<double>(g() >> 11), -53) * ((g() & 1) ? 1 : -1);
    x = std::ldexp(m, static_cast<int>(g() % 400) - 200);
  }
  ExactSum forward;
  for (double x : v) forward.add(x);
  std::vector<double> w = v;
  std::shuffle(w.begin(), w.end(), g);
  ExactSum shuffled, a, b;
  for (double x : w) shuffled.add(x);
  for (size_t i = 0; i < w.size(); ++i) (i % 3 ? a : b).add(w[i]);
  ExactSum merged = ExactSum::from_words(a.to_words());
  merged.merge(ExactSum::from_words(b.to_words()));
  CHECK(same_bits(forward.value(), shuffled.value()));
  CHECK(same_bits(forward.value(), merged.value()));
  CHECK(forward.to_words() == merged.to_words());
  // and it is the correctly rounded sum: compensated reference in long double pairs is not
  // exact, but the exact value must lie within one f64 ulp of a careful long double sum
  long double ref = 0;
  for (double x : v) ref += x;
  CHECK(std::fabs(static_cast<long double>(forward.value()) - ref) <= std::fabs(ref) * 1e-15L + 1e-300L);
}

TEST_CASE("f32 squares: the bucketed path equals adding each exact square", "[exact_sum]") {
  const auto x = wide_floats(200003, 11);  // not a multiple of the block or lane counts
  ExactSum bucketed, scalar;
  bucketed.add_squares(x.data(), static_cast<int64_t>(x.size()));
  for (float f : x) scalar.add(static_cast<double>(f) * static_cast<double>(f));  // exact in f64
  CHECK(bucketed.to_words() == scalar.to_words());
  CHECK(same_bits(bucketed.value(), scalar.value()));
}

TEST_CASE("exact_sum_of_squares_cpu is bitwise independent of the thread count", "[exact_sum]") {
  std::mt19937 g(3);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<float> x(1 << 20);
  for (float& f : x) f = d(g);
  const int saved = omp_get_max_threads();
  double r[2];
  for (int t : {1, 2}) {
    omp_set_num_threads(t);
    r[t - 1] = sum_of_squares_cpu(x.data(), static_cast<int64_t>(x.size()));
  }
  omp_set_num_threads(saved);
  CHECK(same_bits(r[0], r[1]));
  // a split at any element gives the same state
  ExactSum whole, parts;
  exact_sum_of_squares_cpu(x.data(), static_cast<int64_t>(x.size()), whole);
  exact_sum_of_squares_cpu(x.data(), 12345, parts);
  exact_sum_of_squares_cpu(x.data() + 12345, static_cast<int64_t>(x.size()) - 12345, parts);
  CHECK(whole.to_words() == parts.to_words());
  CHECK_THROWS_AS(exact_sum_of_squares_cpu(nullptr, 3, whole), std::invalid_argument);
}
