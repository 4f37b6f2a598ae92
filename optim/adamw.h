// AdamW (bias-corrected Adam with decoupled weight decay) on raw f32 buffers.
#pragma once
#include <cstdint>

namespace mfsdp {

/// Hyperparameters of the AdamW group. `lr` is the group's base learning rate; the engine scales it
/// by the schedule and passes the step's lr to adamw_step_cpu, which ignores this field.
struct AdamWOptions {
  double lr = 3e-3;  ///< base learning rate (>= 0)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

/// One AdamW step over n elements (OpenMP parallel, elementwise; reference: Loshchilov & Hutter,
/// in the form torch.optim.AdamW computes it). p, g, m, v: [n] f32 (parameter, gradient, first and
/// second moments). `step` is 1-based (the number of this update, for bias correction).
///   p <- p*(1 - lr*wd);  m <- b1*m + (1-b1)*g;  v <- b2*v + (1-b2)*g^2;
///   p <- p - (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
/// Throws std::invalid_argument for n < 0, null buffers, step < 1, betas outside [0, 1), eps <= 0,
/// negative weight decay or a non-finite lr.
void adamw_step_cpu(float* p, const float* g, float* m, float* v, int64_t n, double lr, int64_t step,
                    const AdamWOptions& opt);

namespace detail {
/// Throws std::invalid_argument unless the AdamW options and step are usable (names `op`).
void validate_adamw(const AdamWOptions& opt, double lr, int64_t step, const char* op);
}  // namespace detail

}  // namespace mfsdp
