// GEMM rates of bf16 and f32 products and the one rule that `auto` precisions decide by (the
// trainer's precision.matmul_dtype / optimizer.muon.ns_dtype, the benchmarks, the projection).
#pragma once

namespace mfsdp {

/// GEMM rates in GFLOP/s (1e9 FLOP/s): f32 operands (Kernels::gemm) and bf16 operands with f32
/// accumulation (Kernels::gemm_bf16: oneDNN on AVX512-BF16/AMX, else widened to f32).
struct GemmRates {
  double f32 = 0, bf16 = 0;
};

/// bf16 products must beat f32 by this factor in a plain GEMM probe for `auto` to pick them: the
/// GEMM rate leaves out the operand conversions a bf16 step adds, so a near tie goes to f32.
inline constexpr double kBf16Margin = 1.15;
/// The factor for a probe that times the whole computation, conversions included (one
/// Newton-Schulz step, optim/ns_probe.h): measured faster is enough.
inline constexpr double kBf16StepMargin = 1.0;

/// Whether `auto` runs bf16 products on rates `r`: r.f32 > 0 and r.bf16 >= margin * r.f32.
inline bool bf16_pays(const GemmRates& r, double margin = kBf16Margin) {
  return r.f32 > 0 && r.bf16 >= margin * r.f32;
}

}  // namespace mfsdp
