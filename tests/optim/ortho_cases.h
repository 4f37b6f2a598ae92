// Test matrices for the orthogonalizer tests (random, ill-conditioned, rank-deficient) and their
// f64 reference polar factors U V^T.
#pragma once
#include <Eigen/Dense>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "test_helpers.h"

namespace mfsdp::test {

/// A test input with its exact rank and singular values (descending, f64) of the f32 matrix.
struct OrthoCase {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> g;
  int64_t rank = 0;        ///< exact rank of the construction (min(rows, cols) unless rank-deficient)
  Eigen::MatrixXd polar;   ///< U_r V_r^T over the `rank` leading singular pairs, f64
  Eigen::VectorXd sigma;   ///< singular values of g (f64 SVD of the f32 data)
};

/// Random orthonormal columns [n, k] (QR of a Gaussian matrix, f64).
inline Eigen::MatrixXd random_orthonormal(int64_t n, int64_t k, uint32_t seed) {
  const auto v = randn(n * k, seed);
  Eigen::MatrixXd a = Eigen::Map<const RowMatF>(v.data(), n, k).cast<double>();
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(a);
  return qr.householderQ() * Eigen::MatrixXd::Identity(n, k);
}

/// Fills polar and sigma of c from c.g (BDCSVD in f64).
inline void finish_case(OrthoCase& c) {
  RowMatD m = Eigen::Map<const RowMatF>(c.g.data(), c.rows, c.cols).cast<double>();
  Eigen::BDCSVD<Eigen::MatrixXd> svd(m, Eigen::ComputeThinU | Eigen::ComputeThinV);
  c.sigma = svd.singularValues();
  c.polar = svd.matrixU().leftCols(c.rank) * svd.matrixV().leftCols(c.rank).transpose();
}

/// Gaussian N(0, 1) entries (full rank).
inline OrthoCase random_case(int64_t rows, int64_t cols, uint32_t seed) {
  OrthoCase c{"random " + std::to_string(rows) + "x" + std::to_string(cols), rows, cols,
              randn(rows * cols, seed), std::min(rows, cols), {}, {}};
  finish_case(c);
  return c;
}

/// U diag(s) V^T with s log-spaced from 1 down to `smallest` (condition number 1/smallest).
inline OrthoCase ill_conditioned_case(int64_t rows, int64_t cols, double smallest, uint32_t seed) {
  const int64_t k = std::min(rows, cols);
  const Eigen::MatrixXd u = random_orthonormal(rows, k, seed), v = random_orthonormal(cols, k, seed + 1);
  Eigen::VectorXd s(k);
  for (int64_t i = 0; i < k; ++i) s(i) = std::pow(smallest, k > 1 ? static_cast<double>(i) / (k - 1) : 0.0);
  const RowMatD m = u * s.asDiagonal() * v.transpose();
  OrthoCase c{"ill-conditioned " + std::to_string(rows) + "x" + std::to_string(cols), rows, cols, {}, k, {}, {}};
  c.g.resize(static_cast<size_t>(rows * cols));
  Eigen::Map<RowMatF>(c.g.data(), rows, cols) = m.cast<float>();
  finish_case(c);
  return c;
}

/// A [rows, rank] x [rank, cols] product of Gaussian factors (exact rank `rank` before rounding).
inline OrthoCase rank_deficient_case(int64_t rows, int64_t cols, int64_t rank, uint32_t seed) {
  const auto a = randn(rows * rank, seed), b = randn(rank * cols, seed + 1);
  const RowMatD m = Eigen::Map<const RowMatF>(a.data(), rows, rank).cast<double>() *
                    Eigen::Map<const RowMatF>(b.data(), rank, cols).cast<double>();
  OrthoCase c{"rank-" + std::to_string(rank) + " " + std::to_string(rows) + "x" + std::to_string(cols), rows,
              cols, {}, rank, {}, {}};
  c.g.resize(static_cast<size_t>(rows * cols));
  Eigen::Map<RowMatF>(c.g.data(), rows, cols) = m.cast<float>();
  finish_case(c);
  return c;
}

/// ||O - polar||_F / ||polar||_F for a row-major f32 result O.
inline double relative_polar_error(const OrthoCase& c, const std::vector<float>& o) {
  const RowMatD od = Eigen::Map<const RowMatF>(o.data(), c.rows, c.cols).cast<double>();
  return (od - c.polar).norm() / c.polar.norm();
}

}  // namespace mfsdp::test
