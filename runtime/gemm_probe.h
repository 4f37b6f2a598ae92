// The start-up GEMM probe of CPU ranks: bf16-operand and f32 GEMM rates measured at a run's shapes
// and thread count, so that precision choices ("auto") and the MFU denominator come from this
// CPU's measured behaviour rather than from a table of CPU names.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "runtime/core/gemm_rates.h"

namespace mfsdp {

/// One GEMM shape: C[M,N] = A[M,K] B[K,N] (2*M*N*K FLOPs).
struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
};

/// Dense bf16 tensor-core peak of an H100 / H200 SXM (NVIDIA's datasheets: 989 TFLOP/s without
/// sparsity): the MFU denominator of one CUDA rank when none is given.
inline constexpr double kCudaPeakTflops = 989.0;

/// `shape` scaled down (its largest dimension halved, never below 64) until it costs at most
/// `max_flops`, so that a probe of a large model's shape stays short. Dimensions < 1 become 1.
GemmShape probe_shape(GemmShape shape, double max_flops = 2e8);

/// Measures both rates of this process's CPU backend at probe_shape(shape) and cpu_threads():
/// one warm-up call per dtype, then the best of 3-16 alternating timed calls each, about 40 ms in
/// all (longer only where 3 calls take longer).
/// Cached per process by (shape, thread count). Throws what the kernels throw.
GemmRates probe_cpu_gemm_rates(GemmShape shape);

/// The rates of two implementations of the same `flops` of work, f32 and bf16: each warmed up once,
/// then timed in alternation (a pause of the process slows both alike, and the best call of each
/// drops it), at least 3 and at most 16 pairs, stopping once `budget_s` seconds of pairs have run.
GemmRates time_f32_bf16(double flops, const std::function<void()>& f32, const std::function<void()>& bf16,
                        double budget_s = 0.04);

/// "bf16 A GFLOP/s vs f32 B GFLOP/s" for log lines (rates rounded to whole GFLOP/s).
std::string describe_rates(const GemmRates& r);

}  // namespace mfsdp
