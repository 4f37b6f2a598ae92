// The start-up probe of `optimizer.muon.ns_dtype auto`: one Newton-Schulz step timed with f32 and
// with bf16 products. The orthogonalizer's f32 path runs its own kernels (the symmetric products
// as lower triangles, in single-threaded bands), so its speed against bf16 differs from the plain
// GEMM rates of runtime/gemm_probe.h; this probe times the iteration itself.
#pragma once
#include <cstdint>

#include "optim/muon_options.h"
#include "runtime/core/gemm_rates.h"

namespace mfsdp {

/// FLOPs of one quintic Newton-Schulz step on a rows x cols matrix (m <= n its sides): X X^T
/// (2 m m n), A A (2 m^3) and B X (2 m m n).
double ns_step_flops(int64_t rows, int64_t cols);

/// Rates (GFLOP/s by ns_step_flops) of one step of orthogonalize_cpu with `method` (newton_schulz5
/// or polar_express) in f32 and in bf16 products at rows x cols, both sides halved while the step
/// costs over 1.1 GFLOP and the smaller side stays >= 256 (the f32 path's kernel changes below
/// 256), at cpu_threads(); timed by time_f32_bf16 (runtime/gemm_probe.h), about 30-70 ms. Cached
/// per process by (shape, method, thread count). Throws std::invalid_argument for
/// gram_newton_schulz (f32 only) and for sides < 1.
GemmRates probe_orthogonalizer_rates(int64_t rows, int64_t cols, Orthogonalizer method);

}  // namespace mfsdp
