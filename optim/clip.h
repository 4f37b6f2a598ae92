// Global-norm gradient clipping helpers on raw f32 buffers.
#pragma once
#include <cstdint>

namespace mfsdp {

/// Clipping coefficient for a global gradient L2 norm: min(1, max_norm / (global_norm + 1e-6))
/// (the torch.nn.utils.clip_grad_norm_ formula). max_norm <= 0 disables clipping (returns 1).
/// Throws std::invalid_argument when clipping is enabled and global_norm is negative or not finite.
double clip_coefficient(double global_norm, double max_norm);

/// Sum of squares of x[0..n): the exact sum (optim/exact_sum.h) rounded once to f64, so the result
/// does not depend on the thread count, on chunking, or on how x is split across ranks.
/// Throws std::invalid_argument for n < 0 or a null x with n > 0.
double sum_of_squares_cpu(const float* x, int64_t n);

}  // namespace mfsdp
