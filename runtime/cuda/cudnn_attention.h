// Causal grouped-query attention through cuDNN's fused scaled-dot-product attention (the cuDNN C++
// frontend's graph API: sdpa and sdpa_backward nodes), behind Kernels::cudnn_attention_* of the CUDA
// backend (kernels_cuda.cu), which rounds the f32 operands to the bf16 buffers these functions take.
// Internal to runtime/cuda. Built from cudnn_attention.cpp when the build found cuDNN and its
// frontend headers (scripts/fetch_cudnn_frontend.sh), as the shared library mfsdp_cudnn_attention
// (one copy of the frontend's code however many executables link the runtime); otherwise
// cudnn_attention_stub.cpp, whose forward/backward throw std::runtime_error and whose built() is false.
#pragma once
#include <cstdint>

namespace mfsdp::cuda_cudnn {

/// True when this build runs attention through cuDNN (cudnn_attention.cpp), false for the stub.
bool built();

/// The head sizes d the cuDNN attention takes (64 and 128).
inline bool head_dim_supported(int64_t d) { return d == 64 || d == 128; }

/// Sizes of one attention call: B samples of T tokens, H query heads, Hkv key/value heads (Hkv
/// divides H; query head h uses key/value head h / (H/Hkv)), d features per head.
struct Dims {
  int64_t B, T, H, Hkv, d;
};

/// O = softmax(Q K^T / sqrt(d) + causal mask) V and the softmax statistics. Q and O are bf16
/// [B,T,H,d] contiguous, K and V bf16 [B,T,Hkv,d] contiguous, stats f32 [B,H,T]: the natural-log
/// log-sum-exp of each query row's scaled scores (key j <= query i). All device pointers; work is
/// ordered on `stream` (a cudaStream_t: the caller passes device_api.h's compute_stream(), so this
/// library needs nothing of the runtime). Throws std::invalid_argument for a head size other than
/// 64 or 128 or bad sizes, std::runtime_error naming the failing cuDNN step otherwise.
void forward(const void* q, const void* k, const void* v, void* o, float* stats, const Dims& a, void* stream);

/// dQ, dK, dV (bf16, overwritten; laid out as Q, K, V) of the forward above, from dO (bf16 like O),
/// O and stats of that forward. Deterministic (cuDNN's deterministic backward algorithm). Throws
/// as forward.
void backward(const void* q, const void* k, const void* v, const void* o, const void* dout, const float* stats,
              void* dq, void* dk, void* dv, const Dims& a, void* stream);

}  // namespace mfsdp::cuda_cudnn
