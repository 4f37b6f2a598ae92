#include "optim/adamw.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace mfsdp {

namespace detail {
void validate_adamw(const AdamWOptions& opt, double lr, int64_t step, const char* op) {
  const std::string o = std::string("[") + op + "] ";
  if (step < 1) throw std::invalid_argument(o + "step " + std::to_string(step) + " must be >= 1 (1-based)");
  if (!(opt.beta1 >= 0.0 && opt.beta1 < 1.0))
    throw std::invalid_argument(o + "beta1 " + std::to_string(opt.beta1) + " is outside [0, 1)");
  if (!(opt.beta2 >= 0.0 && opt.beta2 < 1.0))
    throw std::invalid_argument(o + "beta2 " + std::to_string(opt.beta2) + " is outside [0, 1)");
  if (!(opt.eps > 0.0)) throw std::invalid_argument(o + "eps " + std::to_string(opt.eps) + " must be > 0");
  if (!std::isfinite(opt.weight_decay) || opt.weight_decay < 0.0)
    throw std::invalid_argument(o + "weight_decay " + std::to_string(opt.weight_decay) +
                                " must be finite and >= 0");
  if (!std::isfinite(lr)) throw std::invalid_argument(o + "learning rate " + std::to_string(lr) + " is not finite");
}
}  // namespace detail

void adamw_step_cpu(float* p, const float* g, float* m, float* v, int64_t n, double lr, int64_t step,
                    const AdamWOptions& opt) {
  detail::validate_adamw(opt, lr, step, "adamw_step_cpu");
  if (n < 0) throw std::invalid_argument("[adamw_step_cpu] n " + std::to_string(n) + " is negative");
  if (n == 0) return;
  if (p == nullptr || g == nullptr || m == nullptr || v == nullptr)
    throw std::invalid_argument("[adamw_step_cpu] null p, g, m or v buffer with n " + std::to_string(n));

  const double bc1 = 1.0 - std::pow(opt.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(opt.beta2, static_cast<double>(step));
  const float b1 = static_cast<float>(opt.beta1), omb1 = static_cast<float>(1.0 - opt.beta1);
  const float b2 = static_cast<float>(opt.beta2), omb2 = static_cast<float>(1.0 - opt.beta2);
  const float decay = static_cast<float>(1.0 - lr * opt.weight_decay);
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(opt.eps);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + omb1 * gi;
    const float vi = b2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * inv_bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

}  // namespace mfsdp
