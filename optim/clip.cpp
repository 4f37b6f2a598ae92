#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace mfsdp {

namespace {
constexpr int64_t kChunk = 1 << 14;  // elements per deterministic partial sum

void check_buffer(const char* op, const float* x, int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string("[") + op + "] n " + std::to_string(n) + " is negative");
  if (n > 0 && x == nullptr)
    throw std::invalid_argument(std::string("[") + op + "] null buffer with n " + std::to_string(n));
}

double chunk_sum_of_squares(const float* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // fixed lanes: vectorizable and order-stable
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

double clip_coefficient(double global_norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0;
  if (!std::isfinite(global_norm) || global_norm < 0.0)
    throw std::invalid_argument("[clip_coefficient] global grad norm " + std::to_string(global_norm) +
                                " is negative or not finite (max_norm " + std::to_string(max_norm) + ")");
  return std::min(1.0, max_norm / (global_norm + 1e-6));
}

double sum_of_squares_cpu(const float* x, int64_t n) {
  check_buffer("sum_of_squares_cpu", x, n);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) return chunk_sum_of_squares(x, n);
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    partial[static_cast<size_t>(c)] = chunk_sum_of_squares(x + begin, std::min(kChunk, n - begin));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void scale_cpu(float* x, int64_t n, float alpha) {
  check_buffer("scale_cpu", x, n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

}  // namespace mfsdp
