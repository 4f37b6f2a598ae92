#include "optim/clip.h"

#include "optim/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace mfsdp {

namespace {
void check_buffer(const char* op, const float* x, int64_t n) {
  if (n < 0) throw std::invalid_argument(std::string("[") + op + "] n " + std::to_string(n) + " is negative");
  if (n > 0 && x == nullptr)
    throw std::invalid_argument(std::string("[") + op + "] null buffer with n " + std::to_string(n));
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
  ExactSum acc;
  exact_sum_of_squares_cpu(x, n, acc);
  return acc.value();
}

}  // namespace mfsdp
