// Quintic Newton-Schulz / Polar Express iterations with bf16 products on the CPU (the products of
// orthogonalize_cpu with NsDType::bf16). Internal to optim/: orthogonalize.cpp normalizes the input
// and transposes tall matrices around this call.
#pragma once
#include <cstdint>
#include <vector>

namespace mfsdp {

/// The coefficients (a, b, c) of one quintic step X <- a X + (b A + c A^2) X, A = X X^T.
struct QuinticStep {
  float a, b, c;
};

/// Runs the steps on X = x (f32 [m, n], row-major, m <= n, already normalized), with y (f32
/// [m, n]) as the second iterate buffer; returns the buffer (x or y) holding the result. Each step,
/// with bf16(.) rounding to bf16 once and every product accumulated in f32:
///   A = bf16(bf16(X) bf16(X)^T);  B = bf16(c A A + b A);  X = B bf16(X) + a X  (f32).
/// The sums are formed in f32 inside the GEMM (oneDNN post-ops), so no separate pass touches A, B
/// or X except the one rounding of X per step. Each product is one whole GEMM on oneDNN's bf16
/// matmul where the CPU has AVX512-BF16 or AMX (its AMX kernel needs dense operands and outputs:
/// triangle-only row bands, whose outputs are strided, fell to a slower kernel), else an f32 GEMM of
/// the exactly widened operands. Deterministic for a fixed thread count and ISA. Scratch is
/// thread-local and reused.
float* quintic_iterations_bf16(float* x, float* y, int64_t m, int64_t n, const std::vector<QuinticStep>& steps);

}  // namespace mfsdp
