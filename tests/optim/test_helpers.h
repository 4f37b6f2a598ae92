// Shared helpers for the optim tests: deterministic random buffers and singular values.
#pragma once
#include <Eigen/Dense>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <omp.h>
#include <random>
#include <vector>

namespace mfsdp::test {

/// Largest |a[i] - b[i]| (the sizes must match).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

/// n samples of N(0, stddev^2) from a fixed seed.
inline std::vector<float> randn(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Singular values (descending) of a row-major [rows, cols] f32 buffer, computed in f64 by BDCSVD.
inline Eigen::VectorXd singular_values(const float* data, int64_t rows, int64_t cols) {
  RowMatD m = Eigen::Map<const RowMatF>(data, rows, cols).cast<double>();
  Eigen::BDCSVD<RowMatD> svd(m);
  return svd.singularValues();
}

/// Runs f with `threads` OpenMP threads (and, when eigen_threads > 0, Eigen::setNbThreads(eigen_threads),
/// as set_cpu_threads does), restoring both afterwards.
template <class F>
void with_threads(int threads, int eigen_threads, F&& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  if (eigen_threads > 0) Eigen::setNbThreads(eigen_threads);
  f();
  Eigen::setNbThreads(0);  // back to following omp_get_max_threads()
  omp_set_num_threads(saved);
}

/// Whether two f32 vectors hold the same bits.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace mfsdp::test
