// The fused classifier's chunking rule and the memory it holds (runtime/ops.h classifier_loss),
// header-only so that the planner's projection counts the bytes the runtime allocates.
#pragma once
#include <algorithm>
#include <cstdint>

namespace mfsdp {

/// Rows per chunk of classifier_loss over a padded vocabulary of Vp columns: the largest multiple
/// of 64 whose f32 logits (rows * Vp * 4 bytes) fit in 256 MiB, and at least 64 (a vocabulary
/// above 1M columns then passes the budget by 64 rows of it). The budget is set by the dW GEMM:
/// each chunk adds dlogits^T h (K = chunk rows) into the f32 dW, reading and writing Vp * C * 8
/// bytes for 2 * Vp * C * K flops, K / 4 flops per byte, which stays compute-bound on a GPU only
/// when K / 4 exceeds its flop-to-bandwidth ratio (about 200 for bf16 on H100/H200): K >= ~800.
/// GPT-2 (Vp = 50304): 1280 rows (245.6 MiB); Llama-2 (32000): 2048; Llama-3 (128256): 512; a
/// character vocabulary (Vp = 128): 524288, so any batch is one chunk.
inline int64_t classifier_chunk_rows(int64_t Vp) {
  constexpr int64_t kBudgetBytes = int64_t{256} << 20, kRowMultiple = 64;
  const int64_t rows = kBudgetBytes / (std::max<int64_t>(Vp, 1) * int64_t{4}) / kRowMultiple * kRowMultiple;
  return std::max(rows, kRowMultiple);
}

/// Bytes classifier_loss holds during a training step of N rows over h [N, C] and W [Vp, C]: one
/// [min(N, chunk rows), Vp] f32 chunk of logits, dW [Vp, C] and dh [N, C] (f32) and the N losses;
/// with bf16 matmuls also the chunk's bf16 copy and the bf16 operands h and W (2 bytes each).
inline double classifier_bytes(double N, double Vp, double C, bool bf16_matmuls) {
  const double rows = std::min(N, static_cast<double>(classifier_chunk_rows(static_cast<int64_t>(Vp))));
  const double f32 = 4.0 * (rows * Vp + Vp * C + N * C + N);
  return bf16_matmuls ? f32 + 2.0 * (rows * Vp + N * C + Vp * C) : f32;
}

}  // namespace mfsdp
