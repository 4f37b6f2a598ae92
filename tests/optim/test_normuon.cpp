// NorMuon normalization (arXiv 2510.05491, Algorithm 1): the PyTorch fixture
// tests/fixtures/normuon_reference.safetensors (gen_normuon_fixture.py), update RMS, per-row
// equalization, zero input, thread-count independence, argument checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "optim/muon.h"
#include "optim/normuon.h"
#include "test_helpers.h"

using namespace mfsdp;
using mfsdp::test::max_abs_diff;
using mfsdp::test::randn;
using mfsdp::test::same_bits;
using mfsdp::test::with_threads;

namespace {

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]) / std::abs(static_cast<double>(b[i])));
  return m;
}

double row_rms(const std::vector<float>& o, int64_t row, int64_t cols) {
  double s = 0.0;
  for (int64_t j = 0; j < cols; ++j) s += static_cast<double>(o[row * cols + j]) * o[row * cols + j];
  return std::sqrt(s / static_cast<double>(cols));
}

}  // namespace

TEST_CASE("NorMuon matches the PyTorch fixture (normalization alone and three full steps)", "[normuon][fixture]") {
  const SafetensorsFile file(std::string(MFSDP_FIXTURE_DIR) + "/normuon_reference.safetensors");
  std::map<std::string, std::vector<float>> fx;
  std::map<std::string, std::vector<int64_t>> shape;
  for (const auto& name : file.names()) {
    fx[name] = file.read_f32(name);
    shape[name] = file.info(name).shape;
  }
  MuonOptions opt;  // the fixture's Algorithm 1: no Nesterov
  opt.nesterov = false;
  opt.weight_decay = 0.1;
  const double lr = 0.05;
  for (const char* key : {"32x48", "64x24"}) {
    const std::string k = key;
    const int64_t rows = shape.at(k + ".W0").at(0), cols = shape.at(k + ".W0").at(1);
    INFO("shape " << k);

    // The normalization on the fixture's own O1: only the NorMuon arithmetic differs.
    std::vector<float> upd = fx.at(k + ".O1"), v(static_cast<size_t>(rows), 0.0f);
    normuon_normalize_cpu(upd.data(), v.data(), rows, cols, 0.95, 1e-8, 0.2);
    CHECK(max_rel_diff(v, fx.at(k + ".v1")) < 1e-6);
    CHECK(max_abs_diff(upd, fx.at(k + ".update1")) < 1e-6);

    // Three steps composed from the kernels: momentum, NS5, NorMuon, apply (scale 1).
    std::vector<float> w = fx.at(k + ".W0"), m(w.size(), 0.0f), u(w.size());
    std::fill(v.begin(), v.end(), 0.0f);
    for (int t = 1; t <= 3; ++t) {
      const std::string ts = std::to_string(t);
      muon_momentum_cpu(fx.at(k + ".G" + ts).data(), m.data(), u.data(), rows * cols, opt);
      orthogonalize_cpu(u.data(), u.data(), rows, cols, 5, Orthogonalizer::newton_schulz5);
      normuon_normalize_cpu(u.data(), v.data(), rows, cols, opt.beta2, opt.normuon_eps);
      muon_apply_update_cpu(w.data(), u.data(), rows * cols, lr, 1.0, opt.weight_decay);
      INFO("step " << t);
      CHECK(max_abs_diff(m, fx.at(k + ".M" + ts)) < 1e-7);
      CHECK(max_rel_diff(v, fx.at(k + ".v" + ts)) < 1e-5);  // measured <= 2.5e-6 (NS round-off)
      CHECK(max_abs_diff(w, fx.at(k + ".W" + ts)) < 5e-7);  // measured <= 1e-7
    }
    // The steps moved W by far more than the tolerance.
    CHECK(max_abs_diff(w, fx.at(k + ".W0")) > 1e-2);
  }
}

TEST_CASE("normuon_normalize_cpu: update RMS is the target, rows are equalized on the first step", "[normuon]") {
  const int64_t rows = 24, cols = 40;
  auto o = randn(rows * cols, 5);
  for (int64_t i = 0; i < rows; ++i)  // rows of very different scale
    for (int64_t j = 0; j < cols; ++j) o[static_cast<size_t>(i * cols + j)] *= static_cast<float>(1 + i * i);
  std::vector<float> v(static_cast<size_t>(rows), 0.0f);
  normuon_normalize_cpu(o.data(), v.data(), rows, cols, 0.9, 0.0, 0.2);
  double total = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    // From v = 0 each row is divided by sqrt(1 - beta2) * its own RMS: every row ends at RMS 0.2.
    CHECK(row_rms(o, i, cols) == Approx(0.2).epsilon(1e-5));
    total += row_rms(o, i, cols) * row_rms(o, i, cols);
    CHECK(v[static_cast<size_t>(i)] > 0.0f);
  }
  CHECK(std::sqrt(total / rows) == Approx(0.2).epsilon(1e-6));

  // A second step: v mixes in the new mean squares, the whole update still has RMS 1.5.
  auto o2 = randn(rows * cols, 6);
  const std::vector<float> v1 = v;
  normuon_normalize_cpu(o2.data(), v.data(), rows, cols, 0.9, 1e-8, 1.5);
  double s = 0.0;
  for (float x : o2) s += static_cast<double>(x) * x;
  CHECK(std::sqrt(s / static_cast<double>(rows * cols)) == Approx(1.5).epsilon(1e-6));
  CHECK(!same_bits(v, v1));
}

TEST_CASE("normuon_normalize_cpu: zero O gives a zero update and decays v", "[normuon]") {
  const int64_t rows = 8, cols = 6;
  std::vector<float> o(static_cast<size_t>(rows * cols), 0.0f), v(static_cast<size_t>(rows), 0.5f);
  normuon_normalize_cpu(o.data(), v.data(), rows, cols, 0.95, 1e-8, 0.2);
  for (float x : o) CHECK(x == 0.0f);
  for (float x : v) CHECK(x == 0.95f * 0.5f + 0.05f * 0.0f);
  std::vector<float> v0(static_cast<size_t>(rows), 0.0f);
  normuon_normalize_cpu(o.data(), v0.data(), rows, cols, 0.95, 0.0, 0.2);  // eps 0, v 0: still 0, no NaN
  for (float x : o) CHECK(x == 0.0f);
}

TEST_CASE("normuon_normalize_cpu is bitwise independent of the OpenMP thread count", "[normuon]") {
  const int64_t rows = 512, cols = 256;  // above the threading threshold
  const auto o0 = randn(rows * cols, 8);
  const auto v0 = randn(rows, 9, 0.01f);
  auto run = [&](int threads) {
    std::vector<float> o = o0, v(v0.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = v0[i] * v0[i];
    with_threads(threads, 0, [&] { normuon_normalize_cpu(o.data(), v.data(), rows, cols); });
    return std::pair{o, v};
  };
  const auto [o1, v1] = run(1);
  const auto [o2, v2] = run(2);
  CHECK(same_bits(o1, o2));
  CHECK(same_bits(v1, v2));
}

TEST_CASE("normuon_normalize_cpu rejects bad arguments; MuonVariant names", "[normuon]") {
  std::vector<float> o(6, 1.0f), v(2, 0.0f);
  CHECK_THROWS_AS(normuon_normalize_cpu(o.data(), v.data(), 0, 3), std::invalid_argument);
  CHECK_THROWS_AS(normuon_normalize_cpu(nullptr, v.data(), 2, 3), std::invalid_argument);
  CHECK_THROWS_AS(normuon_normalize_cpu(o.data(), v.data(), 2, 3, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(normuon_normalize_cpu(o.data(), v.data(), 2, 3, 0.9, -1.0), std::invalid_argument);
  CHECK_THROWS_AS(normuon_normalize_cpu(o.data(), v.data(), 2, 3, 0.9, 1e-8, NAN), std::invalid_argument);
  CHECK(parse_muon_variant("muon") == MuonVariant::muon);
  CHECK(parse_muon_variant("normuon") == MuonVariant::normuon);
  CHECK(std::string(muon_variant_name(MuonVariant::normuon)) == "normuon");
  try {
    parse_muon_variant("adamuon");
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("'adamuon'") != std::string::npos);
    CHECK(msg.find("muon or normuon") != std::string::npos);
  }
}
