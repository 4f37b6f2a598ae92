// Helpers of the CUDA backend tests (test_cuda_backend.cpp, test_cuda_op_table.cpp): random
// inputs, CPU/CUDA buffer pairs and the normalized error max|got - ref| / max|ref|.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/cuda/device_api.h"
#include "runtime/kernels.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

/// Skips the rest of a test case (with a warning) when no CUDA device is usable.
#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    if (!::mfsdp::cuda::available()) {                                  \
      WARN("no CUDA device: skipping CUDA backend tests");              \
      return;                                                           \
    }                                                                   \
  } while (0)

namespace mfsdp::cuda_test {

inline std::vector<float> randn(int64_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

/// n copies of v (a function, so `Pair p(fvec(n))` is never parsed as a declaration).
inline std::vector<float> fvec(int64_t n, float v = 0.0f) { return std::vector<float>(static_cast<size_t>(n), v); }

inline std::vector<int32_t> rand_ids(int64_t n, int32_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

/// A pair of buffers with the same contents, one per device.
struct Pair {
  Tensor cpu, gpu;
  explicit Pair(const std::vector<float>& v)
      : cpu(Tensor::from_vector(v, {static_cast<int64_t>(v.size())})), gpu(cpu.to(Device::CUDA)) {}
  float* c() const { return cpu.data_f32(); }
  float* g() const { return gpu.data_f32(); }
};
struct IdPair {
  Tensor cpu, gpu;
  explicit IdPair(const std::vector<int32_t>& v)
      : cpu(tokens_tensor(v, {static_cast<int64_t>(v.size())})), gpu(cpu.to(Device::CUDA)) {}
  const int32_t* c() const { return cpu.data<int32_t>(); }
  const int32_t* g() const { return gpu.data<int32_t>(); }
};

/// max|got - ref| / max|ref| (ref all zero: the absolute max difference).
inline double norm_err(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - ref[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
  }
  return scale > 0 ? diff / scale : diff;
}
inline double norm_err(const Pair& p) { return norm_err(p.gpu.to_vector(), p.cpu.to_vector()); }
inline bool bitwise_equal(const Pair& p) {
  const auto a = p.gpu.to_vector(), b = p.cpu.to_vector();
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline Kernels& GK() { return kernels(Device::CUDA); }
inline Kernels& CK() { return kernels(Device::CPU); }

}  // namespace mfsdp::cuda_test
