// CUDA launchers of fused (flash) causal grouped-query attention behind Kernels::flash_attention_*
// of the CUDA backend (kernels_cuda.cu). Same semantics as the CPU backend (runtime/kernels.h):
// out and lse [B,H,T] forward; dq/dk/dv accumulated (+=) backward, deterministically (no atomics).
// Internal to runtime/cuda. All pointers are device memory; launches go to the legacy default
// stream; errors throw std::invalid_argument (sizes) or std::runtime_error (CUDA_CHECK_LAUNCH).
#pragma once
#include <cstdint>

namespace mfsdp::cuda_flash {

/// Largest head dimension the kernels take (a query row's q and accumulators live in registers).
constexpr int64_t kMaxHeadDim = 128;

/// Sizes and strides as Kernels::AttentionDims (restated so this header needs no kernels.h).
struct Dims {
  int64_t B, T, H, Hkv, d, ldq, ldkv;
};

/// out [B,T,H*d] and lse [B,H,T]. Eight threads per query row, key/value tiles in shared memory,
/// online softmax in f32 (FlashAttention-2's loop order). Throws when d > kMaxHeadDim.
void forward(const float* q, const float* k, const float* v, float* out, float* lse, const Dims& a);
/// dq += ..., dk += ..., dv += .... `rowdot` is scratch of B*H*T floats (D_i = dout_i . out_i).
/// Two kernels: per query row (dq, and D), then per key row (dk, dv over the group's query heads
/// in order).
void backward(const float* dout, const float* q, const float* k, const float* v, const float* out, const float* lse,
              float* dq, float* dk, float* dv, float* rowdot, const Dims& a);

}  // namespace mfsdp::cuda_flash
