// CUDA Muon / AdamW against the CPU kernels on random inputs (bf16 tolerance for Newton-Schulz,
// f32 tolerance for the elementwise kernels, bitwise equality for the exact sum of squares).
// Exits 77 (ctest: skipped) when no GPU is present.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optim/optim.h"
#include "optim/optim_cuda.h"
#include "optim/step.h"
#include "test_helpers.h"

using namespace mfsdp;
using mfsdp::test::randn;
using mfsdp::test::singular_values;

namespace {

void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// A CUDA tensor holding a copy of `h` (read back with to_vector()).
Tensor on_device(const std::vector<float>& h) {
  return Tensor::from_vector(h, {static_cast<int64_t>(h.size())}, Device::CUDA);
}

struct Cuda {
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  Cuda() {
    cu(cudaStreamCreate(&stream), "cudaStreamCreate");
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
  }
  ~Cuda() {
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
  }
};

/// ||a - b||_F / ||b||_F
double rel_fro(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

/// Bitwise equality of two doubles (memcmp: tells -0 from +0 and compares NaN payloads).
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

float float_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(float));
  return f;
}

/// n floats with random sign, mantissa and exponent field in [0, 254]: subnormals, zeros and
/// normals up to FLT_MAX, so the squares land in every digit position the accumulator uses.
std::vector<float> wide_range_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> expf(0, 254), frac(0, 0x7fffffu), sign(0, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float_from_bits(sign(rng) << 31 | expf(rng) << 23 | frac(rng));
  return v;
}

/// The CPU reference state for x[0..n).
ExactSum cpu_exact(const std::vector<float>& x) {
  ExactSum acc;
  exact_sum_of_squares_cpu(x.data(), static_cast<int64_t>(x.size()), acc);
  return acc;
}

/// GPU sum of squares of a host vector (copied to the device), as a double and as exact state.
double gpu_sum(const Cuda& cuda, const std::vector<float>& x, ExactSum* state = nullptr) {
  Tensor d = on_device(x);
  ExactSum acc;
  exact_sum_of_squares_cuda(d.data_f32(), static_cast<int64_t>(x.size()), acc, cuda.stream);
  if (state) *state = acc;
  return acc.value();
}

}  // namespace

TEST_CASE("newton_schulz_cuda (bf16 GEMMs) matches the f32 CPU result", "[cuda][muon]") {
  Cuda cuda;
  MuonCudaWorkspace ws;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{768, 3072}, {3072, 768}, {384, 64}, {100, 37}}) {
    const auto g = randn(rows * cols, 5 + static_cast<uint32_t>(rows));
    std::vector<float> ref(g.size());
    newton_schulz_cpu(g.data(), ref.data(), rows, cols, 5);
    Tensor dg = on_device(g), dout = on_device(std::vector<float>(g.size(), 0.0f));
    newton_schulz_cuda(dg.data_f32(), dout.data_f32(), rows, cols, 5, cuda.stream, cuda.handle, &ws);
    cu(cudaStreamSynchronize(cuda.stream), "sync");
    const auto out = dout.to_vector();
    INFO("shape " << rows << "x" << cols);
    CHECK(rel_fro(out, ref) < 0.04);  // bf16 iterations: ~1-1.5% in a PyTorch bf16 simulation
    const auto sv = singular_values(out.data(), rows, cols);
    CHECK(sv.minCoeff() >= 0.6);
    CHECK(sv.maxCoeff() <= 1.25);
    CHECK(dg.to_vector() == g);  // input untouched
  }
}

TEST_CASE("newton_schulz_batched_cuda: each matrix as the one-matrix call, with its own norm", "[cuda][muon]") {
  Cuda cuda;
  MuonCudaWorkspace ws;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{256, 512}, {512, 256}, {100, 37}}) {
    const int64_t batch = 3, numel = rows * cols;
    std::vector<float> g = randn(batch * numel, 21 + static_cast<uint32_t>(rows));
    for (int64_t i = 0; i < numel; ++i) g[static_cast<size_t>(numel + i)] *= 100.0f;  // norms differ per matrix
    Tensor dg = on_device(g), dout = on_device(std::vector<float>(g.size(), 0.0f));
    newton_schulz_batched_cuda(dg.data_f32(), dout.data_f32(), batch, rows, cols, 5, cuda.stream, cuda.handle, &ws);
    cu(cudaStreamSynchronize(cuda.stream), "sync");
    const auto out = dout.to_vector();
    for (int64_t b = 0; b < batch; ++b) {
      INFO("shape " << rows << "x" << cols << ", matrix " << b);
      const std::vector<float> gi(g.begin() + b * numel, g.begin() + (b + 1) * numel);
      Tensor one = on_device(gi), one_out = on_device(std::vector<float>(gi.size(), 0.0f));
      newton_schulz_cuda(one.data_f32(), one_out.data_f32(), rows, cols, 5, cuda.stream, cuda.handle, &ws);
      cu(cudaStreamSynchronize(cuda.stream), "sync");
      const std::vector<float> got(out.begin() + b * numel, out.begin() + (b + 1) * numel);
      CHECK(rel_fro(got, one_out.to_vector()) < 1e-2);  // same bf16 arithmetic; cuBLAS may pick other kernels
      std::vector<float> ref(gi.size());
      newton_schulz_cpu(gi.data(), ref.data(), rows, cols, 5);
      CHECK(rel_fro(got, ref) < 0.04);
    }
  }
}

TEST_CASE("muon_step_cuda matches muon_step_cpu (momentum exact, update to bf16 tolerance)", "[cuda][muon]") {
  Cuda cuda;
  const int64_t rows = 3 * 256, cols = 256;
  const auto w0 = randn(rows * cols, 1, 0.02f), g1 = randn(rows * cols, 2), g2 = randn(rows * cols, 3);
  for (bool split : {false, true}) {
    MuonOptions opt;
    opt.weight_decay = 0.1;
    opt.split_qkv = split;
    const double lr = 0.02;
    std::vector<float> w = w0, m(w0.size(), 0.0f);
    Tensor dw = on_device(w0), dm = on_device(m), dg1 = on_device(g1), dg2 = on_device(g2);
    reset_newton_schulz_call_count();
    for (const auto* g : {&g1, &g2}) muon_step_cpu(w.data(), g->data(), m.data(), rows, cols, lr, opt, 3);
    const int64_t cpu_calls = newton_schulz_call_count();
    reset_newton_schulz_call_count();
    muon_step_cuda(dw.data_f32(), dg1.data_f32(), dm.data_f32(), rows, cols, lr, opt, 3, cuda.stream, cuda.handle);
    muon_step_cuda(dw.data_f32(), dg2.data_f32(), dm.data_f32(), rows, cols, lr, opt, 3, cuda.stream, cuda.handle);
    cu(cudaStreamSynchronize(cuda.stream), "sync");
    INFO("split_qkv " << split);
    CHECK(newton_schulz_call_count() == cpu_calls);
    CHECK(cpu_calls == (split ? 6 : 2));
    const auto wg = dw.to_vector(), mg = dm.to_vector();
    for (size_t i = 0; i < m.size(); ++i) REQUIRE(mg[i] == Approx(m[i]).epsilon(1e-5).margin(1e-7));
    std::vector<float> du_gpu(w.size()), du_cpu(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      du_gpu[i] = wg[i] - w0[i] * static_cast<float>((1 - lr * 0.1) * (1 - lr * 0.1));
      du_cpu[i] = w[i] - w0[i] * static_cast<float>((1 - lr * 0.1) * (1 - lr * 0.1));
    }
    CHECK(rel_fro(du_gpu, du_cpu) < 0.04);
  }
}

TEST_CASE("adamw_step_cuda matches adamw_step_cpu", "[cuda][adamw]") {
  Cuda cuda;
  const int64_t n = 1 << 20 | 12345;
  const auto p0 = randn(n, 7);
  AdamWOptions opt;
  opt.weight_decay = 0.1;
  std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
  Tensor dp = on_device(p), dm = on_device(m), dv = on_device(v);
  for (int t = 1; t <= 3; ++t) {
    const auto g = randn(n, 50 + t);
    Tensor dg = on_device(g);
    adamw_step_cpu(p.data(), g.data(), m.data(), v.data(), n, 1e-3 * t, t, opt);
    adamw_step_cuda(dp.data_f32(), dg.data_f32(), dm.data_f32(), dv.data_f32(), n, 1e-3 * t, t, opt, cuda.stream);
    cu(cudaStreamSynchronize(cuda.stream), "sync");
  }
  const auto pg = dp.to_vector(), mg = dm.to_vector(), vg = dv.to_vector();
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(pg[i] == Approx(p[i]).epsilon(1e-5).margin(1e-6));
    REQUIRE(mg[i] == Approx(m[i]).epsilon(1e-5).margin(1e-7));
    REQUIRE(vg[i] == Approx(v[i]).epsilon(1e-5).margin(1e-9));
  }
}

TEST_CASE("exact_sum_of_squares_cuda: the CPU state for any split and chunk", "[cuda][clip]") {
  Cuda cuda;
  const int64_t n = 1000003;
  const auto x = randn(n, 9);
  Tensor dx = on_device(x);
  const ExactSum ref = cpu_exact(x);

  // The exact state (every digit, not only the rounded value) matches the CPU accumulator, for
  // any split of x across calls and any per-launch chunk size.
  ExactSum whole, split, chunked;
  exact_sum_of_squares_cuda(dx.data_f32(), n, whole, cuda.stream);
  CHECK(whole.to_words() == ref.to_words());
  exact_sum_of_squares_cuda(dx.data_f32(), 12345, split, cuda.stream);
  exact_sum_of_squares_cuda(dx.data_f32() + 12345, n - 12345, split, cuda.stream);
  CHECK(split.to_words() == ref.to_words());
  detail::exact_sum_of_squares_cuda_chunked(dx.data_f32(), n, chunked, 4099, cuda.stream);
  CHECK(chunked.to_words() == ref.to_words());

  // Adds into a non-empty accumulator.
  ExactSum pre_gpu, pre_cpu;
  for (double v : {-3.25, 1e-30, 7.0}) {
    pre_gpu.add(v);
    pre_cpu.add(v);
  }
  exact_sum_of_squares_cuda(dx.data_f32(), n, pre_gpu, cuda.stream);
  exact_sum_of_squares_cpu(x.data(), n, pre_cpu);
  CHECK(pre_gpu.to_words() == pre_cpu.to_words());
  CHECK(same_bits(pre_gpu.value(), pre_cpu.value()));

  // Empty input: an untouched accumulator; bad arguments throw.
  ExactSum empty;
  exact_sum_of_squares_cuda(dx.data_f32(), 0, empty, cuda.stream);
  CHECK(empty.is_zero());
  CHECK_THROWS_AS(exact_sum_of_squares_cuda(dx.data_f32(), -1, empty, cuda.stream), std::invalid_argument);
  CHECK_THROWS_AS(exact_sum_of_squares_cuda(nullptr, 5, empty, cuda.stream), std::invalid_argument);
  CHECK_THROWS_AS(detail::exact_sum_of_squares_cuda_chunked(dx.data_f32(), n, empty, 0, cuda.stream),
                  std::invalid_argument);
}

TEST_CASE("exact_sum_of_squares_cuda over many buffers: one call, the CPU state digit for digit", "[cuda][clip]") {
  Cuda cuda;
  // buffers of varied lengths (the first empty) carved out of one wide-range vector, as a rank's
  // owned gradient shards; then 133334 tiny buffers, more pieces than one launch's grid rows
  const auto x = wide_range_floats(400000, 31);
  Tensor dx = on_device(x);
  for (int64_t tiny : {int64_t(0), int64_t(3)}) {
    std::vector<const float*> ptrs;
    std::vector<int64_t> ns;
    ExactSum cpu;
    int64_t at = 0;
    for (int64_t k = 0; at < static_cast<int64_t>(x.size()); ++k) {
      const int64_t len = std::min<int64_t>(tiny ? tiny : (k * 7919) % 50000, static_cast<int64_t>(x.size()) - at);
      ptrs.push_back(dx.data_f32() + at);
      ns.push_back(len);
      exact_sum_of_squares_cpu(x.data() + at, len, cpu);
      at += len;  // k = 0 of the varied lengths is an empty buffer
    }
    INFO(ptrs.size() << " buffers");
    ExactSum gpu;
    exact_sum_of_squares_cuda(ptrs, ns, gpu, cuda.stream);
    CHECK(gpu.to_words() == cpu.to_words());
    CHECK(same_bits(gpu.value(), cpu.value()));
  }
  // through optim/step.h on tensors: CUDA (one launch) and CPU (one tensor after another) agree
  std::vector<Tensor> on_gpu, on_cpu;
  for (int64_t len : {int64_t(1000), int64_t(0), int64_t(77777), int64_t(5)}) {
    const std::vector<float> part(x.begin(), x.begin() + len);
    on_cpu.push_back(Tensor::from_vector(part, {len}));
    on_gpu.push_back(on_cpu.back().to(Device::CUDA));
  }
  ExactSum a, b;
  add_sum_of_squares(on_gpu, a);
  add_sum_of_squares(on_cpu, b);
  CHECK(a.to_words() == b.to_words());
  ExactSum none;
  exact_sum_of_squares_cuda(std::vector<const float*>{dx.data_f32()}, std::vector<int64_t>{0}, none, cuda.stream);
  CHECK(none.is_zero());
  CHECK_THROWS_AS(exact_sum_of_squares_cuda(std::vector<const float*>{nullptr}, std::vector<int64_t>{4}, none,
                                            cuda.stream),
                  std::invalid_argument);
  CHECK_THROWS_AS(exact_sum_of_squares_cuda(std::vector<const float*>{dx.data_f32()}, std::vector<int64_t>{}, none,
                                            cuda.stream),
                  std::invalid_argument);
}

TEST_CASE("exact_sum_of_squares_cuda: subnormals, huge values, extremes", "[cuda][clip]") {
  Cuda cuda;
  // Every exponent (squares from 2^-298 to ~2^256): the sum is dominated by the huge values, but
  // the exact state must match the CPU digit for digit.
  {
    const auto x = wide_range_floats(1 << 20, 21);
    ExactSum gpu;
    const double s = gpu_sum(cuda, x, &gpu);
    CHECK(gpu.to_words() == cpu_exact(x).to_words());
    CHECK(same_bits(s, sum_of_squares_cpu(x.data(), static_cast<int64_t>(x.size()))));
    CHECK(std::isfinite(s));
  }
  // Subnormals only (random and the extremes): a tiny but nonzero sum, still bitwise equal.
  {
    std::mt19937 rng(33);
    std::uniform_int_distribution<uint32_t> frac(1, 0x7fffffu);
    std::vector<float> x(200001);
    for (auto& v : x) v = float_from_bits(frac(rng) | (rng() & 1u) << 31);
    x[0] = float_from_bits(1u);           // smallest subnormal: square 2^-298
    x[1] = float_from_bits(0x7fffffu);    // largest subnormal
    x[2] = std::numeric_limits<float>::min();
    ExactSum gpu;
    const double s = gpu_sum(cuda, x, &gpu);
    CHECK(s > 0.0);
    CHECK(gpu.to_words() == cpu_exact(x).to_words());
    CHECK(same_bits(s, sum_of_squares_cpu(x.data(), static_cast<int64_t>(x.size()))));
  }
  // The heaviest digits: many copies of +-FLT_MAX (all-ones mantissa) fill every digit of their
  // bins; a single smallest subnormal still lands in the low bins.
  {
    std::vector<float> x(1000000, std::numeric_limits<float>::max());
    for (size_t i = 0; i < x.size(); i += 3) x[i] = -x[i];
    x[777] = float_from_bits(1u);
    ExactSum gpu;
    const double s = gpu_sum(cuda, x, &gpu);
    CHECK(gpu.to_words() == cpu_exact(x).to_words());
    CHECK(same_bits(s, sum_of_squares_cpu(x.data(), static_cast<int64_t>(x.size()))));
    Tensor d = on_device(x);
    ExactSum chunked;
    detail::exact_sum_of_squares_cuda_chunked(d.data_f32(), static_cast<int64_t>(x.size()), chunked, 1000, cuda.stream);
    CHECK(chunked.to_words() == gpu.to_words());
  }
  // Zeros only (both signs): exactly +0.0.
  {
    std::vector<float> x(4096, 0.0f);
    for (size_t i = 0; i < x.size(); i += 2) x[i] = -0.0f;
    CHECK(same_bits(gpu_sum(cuda, x), 0.0));
  }
}

TEST_CASE("exact_sum_of_squares_cuda: NaN and Inf", "[cuda][clip]") {
  Cuda cuda;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto with = [](std::vector<std::pair<size_t, float>> specials) {
    auto x = randn(100003, 17);
    for (auto [i, v] : specials) x[i] = v;
    return x;
  };
  const auto check_same = [&](const std::vector<float>& x) {
    ExactSum gpu;
    const double s = gpu_sum(cuda, x, &gpu);
    CHECK(gpu.to_words() == cpu_exact(x).to_words());
    CHECK(same_bits(s, sum_of_squares_cpu(x.data(), static_cast<int64_t>(x.size()))));
    return s;
  };
  const double pinf = check_same(with({{5, inf}}));
  CHECK((std::isinf(pinf) && pinf > 0));
  const double minf = check_same(with({{99999, -inf}}));  // (-Inf)^2 = +Inf
  CHECK((std::isinf(minf) && minf > 0));
  CHECK(std::isnan(check_same(with({{0, nan}}))));
  CHECK(std::isnan(check_same(with({{3, -nan}, {100002, inf}}))));
  CHECK(std::isnan(check_same(with({{1, float_from_bits(0x7f800001u)}}))));  // signalling NaN bits
  // Flags from a later chunk survive the merge.
  const auto x = with({{90000, inf}});
  Tensor d = on_device(x);
  ExactSum chunked;
  detail::exact_sum_of_squares_cuda_chunked(d.data_f32(), static_cast<int64_t>(x.size()), chunked, 1024, cuda.stream);
  CHECK(chunked.to_words() == cpu_exact(x).to_words());
  CHECK(same_bits(chunked.value(), std::numeric_limits<double>::infinity()));
}

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIPPED optim.cuda: no CUDA device available (cudaGetDeviceCount: %s, count %d)\n",
                e == cudaSuccess ? "ok" : cudaGetErrorString(e), count);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
