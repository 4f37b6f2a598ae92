// AdamW: closed-form first step, a hand-written f64 scalar reference over several steps, validation.
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "optim/adamw.h"
#include "test_helpers.h"

using namespace mfsdp;
using mfsdp::test::randn;

namespace {
/// Scalar AdamW exactly as written in Loshchilov & Hutter / torch.optim.AdamW, in f64.
struct ScalarAdamW {
  double p, m = 0.0, v = 0.0;
  void step(double g, double lr, int64_t t, const AdamWOptions& o) {
    p *= 1.0 - lr * o.weight_decay;
    m = o.beta1 * m + (1.0 - o.beta1) * g;
    v = o.beta2 * v + (1.0 - o.beta2) * g * g;
    const double m_hat = m / (1.0 - std::pow(o.beta1, t));
    const double v_hat = v / (1.0 - std::pow(o.beta2, t));
    p -= lr * m_hat / (std::sqrt(v_hat) + o.eps);
  }
};
}  // namespace

TEST_CASE("adamw first step: update = lr * g / (|g| + eps) (sign-like)", "[adamw]") {
  const int64_t n = 1000;
  const auto p0 = randn(n, 1), g = randn(n, 2);
  std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
  AdamWOptions opt;  // 0.9, 0.95, 1e-8, wd 0
  const double lr = 1e-3;
  adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), n, lr, 1, opt);
  for (int64_t i = 0; i < n; ++i) {
    // m_hat = g, v_hat = g^2 after bias correction, so the step is lr * g / (|g| + eps).
    const double expected = lr * g[i] / (std::abs(g[i]) + 1e-8);
    REQUIRE(p0[i] - p[i] == Approx(expected).margin(2e-7));
    REQUIRE(std::abs(p0[i] - p[i]) == Approx(lr).epsilon(1e-3).margin(2e-7));  // |g| >> eps here
    REQUIRE(m[i] == Approx(0.1 * g[i]).epsilon(1e-6));
    REQUIRE(v[i] == Approx(0.05 * g[i] * g[i]).epsilon(1e-5));
  }
}

TEST_CASE("adamw first step with decoupled weight decay", "[adamw]") {
  std::vector<float> p = {2.0f, -1.0f, 0.5f}, g = {0.0f, 0.0f, 0.0f}, m(3, 0.0f), v(3, 0.0f);
  AdamWOptions opt;
  opt.weight_decay = 1.0;
  adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), 3, 0.1, 1, opt);  // zero grad: only decay acts
  CHECK(p[0] == Approx(1.8).epsilon(1e-7));
  CHECK(p[1] == Approx(-0.9).epsilon(1e-7));
  CHECK(p[2] == Approx(0.45).epsilon(1e-7));
}

TEST_CASE("adamw several steps match a scalar f64 reference", "[adamw]") {
  const int64_t n = 100003;  // odd size, large enough for the parallel loop
  const auto p0 = randn(n, 3);
  AdamWOptions opt;
  opt.beta1 = 0.8;
  opt.beta2 = 0.99;
  opt.eps = 1e-6;
  opt.weight_decay = 0.1;
  std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
  std::vector<ScalarAdamW> ref;
  ref.reserve(n);
  for (float x : p0) ref.push_back(ScalarAdamW{x});
  const double lrs[] = {1e-2, 5e-3, 2e-3, 1e-3, 3e-3};
  for (int t = 1; t <= 5; ++t) {
    const auto g = randn(n, 100 + t, 0.1f * t);
    adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), n, lrs[t - 1], t, opt);
    for (int64_t i = 0; i < n; ++i) ref[i].step(g[i], lrs[t - 1], t, opt);
  }
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(p[i] - ref[i].p) / (1e-3 + std::abs(ref[i].p)));
    REQUIRE(m[i] == Approx(ref[i].m).epsilon(1e-4).margin(1e-7));
    REQUIRE(v[i] == Approx(ref[i].v).epsilon(1e-4).margin(1e-9));
  }
  CHECK(worst < 1e-5);
}

TEST_CASE("adamw validates its inputs", "[adamw]") {
  std::vector<float> p(4), g(4), m(4), v(4);
  AdamWOptions opt;
  CHECK_THROWS_WITH(adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), 4, 1e-3, 0, opt),
                    Catch::Contains("step 0"));
  opt.beta2 = 1.0;
  CHECK_THROWS_WITH(adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), 4, 1e-3, 1, opt),
                    Catch::Contains("beta2"));
  opt = AdamWOptions{};
  opt.eps = 0.0;
  CHECK_THROWS_AS(adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), 4, 1e-3, 1, opt), std::invalid_argument);
  opt = AdamWOptions{};
  CHECK_THROWS_AS(adamw_step_cpu(nullptr, g.data(), m.data(), v.data(), 4, 1e-3, 1, opt), std::invalid_argument);
  CHECK_THROWS_AS(adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), -1, 1e-3, 1, opt), std::invalid_argument);
  CHECK_NOTHROW(adamw_step_cpu(nullptr, nullptr, nullptr, nullptr, 0, 1e-3, 1, opt));  // empty shard: no-op
}
