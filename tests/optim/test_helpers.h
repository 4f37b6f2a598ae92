// Shared helpers for the optim tests: deterministic random buffers and singular values.
#pragma once
#include <Eigen/Dense>
#include <cstdint>
#include <random>
#include <vector>

namespace mfsdp::test {

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

}  // namespace mfsdp::test
