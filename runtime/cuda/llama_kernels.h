// CUDA launchers of the Llama building blocks (RMSNorm, RoPE, SwiGLU) behind the Kernels methods
// of the CUDA backend (kernels_cuda.cu); same formulas and accumulation semantics as the CPU
// backend (runtime/kernels.h). Internal to runtime/cuda. All pointers are device memory; launches
// go to the legacy default stream; errors throw std::runtime_error (CUDA_CHECK_LAUNCH).
#pragma once
#include <cstdint>

namespace mfsdp::cuda_llama {

/// y = x * rstd * w per row, rstd[r] = 1/sqrt(mean(x_r^2) + eps); one block per row.
/// Out = float, or uint16_t: y as bf16 bits (the f32 result rounded to nearest even).
template <class Out>
void rmsnorm_forward(const float* x, const float* w, Out* y, float* rstd, int64_t rows, int64_t cols, float eps);
/// dx += rstd * (dy*w - n * mean(dy*w*n)) with n = x * rstd; one block per row (dw is a column sum
/// the caller runs).
void rmsnorm_backward_dx(const float* dy, const float* x, const float* w, const float* rstd, float* dx, int64_t rows,
                         int64_t cols);
/// Kernels::rope: rotate_half RoPE on x [B, T, heads*d] (transpose: y += R^T x, else y = R x).
void rope(const float* x, float* y, int64_t B, int64_t T, int64_t heads, int64_t d, float theta, bool transpose);
/// y = silu(g) * u. Out = float, or uint16_t: y as bf16 bits (as rmsnorm_forward).
template <class Out>
void swiglu_forward(const float* g, const float* u, Out* y, int64_t n);
/// dg += dy * u * silu'(g), du += dy * silu(g) (either may be null).
void swiglu_backward(const float* g, const float* u, const float* dy, float* dg, float* du, int64_t n);

}  // namespace mfsdp::cuda_llama
