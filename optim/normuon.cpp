// NorMuon per-row second-moment normalization (arXiv 2510.05491, Algorithm 1) on raw f32 buffers.
#include "optim/normuon.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace mfsdp {

void normuon_normalize_cpu(float* O, float* v, int64_t rows, int64_t cols, double beta2, double eps,
                           double target_rms) {
  if (rows <= 0 || cols <= 0)
    throw std::invalid_argument("[normuon_normalize_cpu] shape [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] must be positive");
  if (O == nullptr || v == nullptr) throw std::invalid_argument("[normuon_normalize_cpu] null O or v buffer");
  if (!(beta2 >= 0.0 && beta2 < 1.0))
    throw std::invalid_argument("[normuon_normalize_cpu] beta2 " + std::to_string(beta2) + " is outside [0, 1)");
  if (!(eps >= 0.0) || !std::isfinite(eps))
    throw std::invalid_argument("[normuon_normalize_cpu] eps " + std::to_string(eps) + " must be finite and >= 0");
  if (!(target_rms >= 0.0) || !std::isfinite(target_rms))
    throw std::invalid_argument("[normuon_normalize_cpu] target_rms " + std::to_string(target_rms) +
                                " must be finite and >= 0");

  const float b2 = static_cast<float>(beta2);
  const float one_minus_b2 = static_cast<float>(1.0 - beta2);
  const float epsf = static_cast<float>(eps);
  // Per row: the mean square (f64, sequential in j), the EMA, the division, and the row's sum of
  // squares of Oh (f64, sequential in j). Rows are independent, so the OpenMP split does not
  // change any bit; the total is summed over rows in order afterwards.
  std::vector<double> row_sq(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t i = 0; i < rows; ++i) {
    float* o = O + i * cols;
    double ss = 0.0;
    for (int64_t j = 0; j < cols; ++j) ss += static_cast<double>(o[j]) * static_cast<double>(o[j]);
    const float mean_sq = static_cast<float>(ss / static_cast<double>(cols));
    const float vi = b2 * v[i] + one_minus_b2 * mean_sq;
    v[i] = vi;
    const float denom = std::sqrt(vi) + epsf;
    double hs = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const float h = denom > 0.0f ? o[j] / denom : 0.0f;
      o[j] = h;
      hs += static_cast<double>(h) * static_cast<double>(h);
    }
    row_sq[static_cast<size_t>(i)] = hs;
  }
  double total = 0.0;
  for (double r : row_sq) total += r;
  const double norm = std::sqrt(total);
  const float scale = norm > 0.0
                          ? static_cast<float>(target_rms * std::sqrt(static_cast<double>(rows) * cols) / norm)
                          : 0.0f;
  const int64_t n = rows * cols;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t k = 0; k < n; ++k) O[k] *= scale;
}

}  // namespace mfsdp
