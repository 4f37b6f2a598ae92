// The start-up GEMM probe of CPU ranks: bf16-operand and f32 GEMM rates measured at a run's shapes
// and thread count, so that precision choices ("auto") and the MFU denominator come from this
// CPU's measured behaviour rather than from a table of CPU names.
#pragma once
#include <cstdint>
#include <string>

namespace mfsdp {

/// One GEMM shape: C[M,N] = A[M,K] B[K,N] (2*M*N*K FLOPs).
struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
};

/// GEMM rates in GFLOP/s (1e9 FLOP/s): f32 operands (Kernels::gemm) and bf16 operands with f32
/// accumulation (Kernels::gemm_bf16: oneDNN on AVX512-BF16/AMX, else widened to f32).
struct GemmRates {
  double f32 = 0, bf16 = 0;
};

/// bf16 products must beat f32 by this factor for `auto` to pick them: the GEMM rate leaves out
/// the operand conversions a bf16 step adds, so a near tie goes to f32.
inline constexpr double kBf16Margin = 1.15;

/// `shape` scaled down (its largest dimension halved, never below 64) until it costs at most
/// `max_flops`, so that a probe of a large model's shape stays short. Dimensions < 1 become 1.
GemmShape probe_shape(GemmShape shape, double max_flops = 2e8);

/// Measures both rates of this process's CPU backend at probe_shape(shape) and cpu_threads():
/// one warm-up call and the best of two timed calls per dtype (about 10-40 ms on 1-2 cores).
/// Cached per process by (shape, thread count). Throws what the kernels throw.
GemmRates probe_cpu_gemm_rates(GemmShape shape);

/// Whether `auto` runs bf16 products on rates `r`: r.f32 > 0 and r.bf16 >= kBf16Margin * r.f32.
bool bf16_pays(const GemmRates& r);

/// "bf16 A GFLOP/s vs f32 B GFLOP/s" for log lines (rates rounded to whole GFLOP/s).
std::string describe_rates(const GemmRates& r);

}  // namespace mfsdp
