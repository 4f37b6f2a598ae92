// Launch shapes and deterministic in-block reductions shared by the CUDA kernel files
// (kernels_cuda.cu, llama_kernels.cu). Internal to runtime/cuda.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mfsdp::cuda_detail {

constexpr int kThreads = 256;        // threads per block of the elementwise / row kernels
constexpr int kMaxGrid = 65535 * 8;  // cap of grid-stride launches (any larger n loops)

inline int grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxGrid));
}

// ---------------- reductions inside a block (fixed tree: deterministic) ----------------

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x == kThreads); every thread gets the result. `sh` holds kThreads/32.
template <class T>
__device__ inline T block_sum(T v, T* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read from a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T r = lane < kThreads / 32 ? sh[lane] : T(0);
  return warp_sum(r);
}
__device__ inline float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = lane < kThreads / 32 ? sh[lane] : -INFINITY;
  return warp_max(r);
}

// f32 -> bf16 bits, round to nearest even, NaN kept as a quiet NaN: the bit recipe of float_to_bf16 (dtype.h).
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// A kernel's f32 result stored as float, or as bf16 bits (uint16_t) rounded as bf16_bits rounds.
__device__ __forceinline__ void store_as(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_as(uint16_t* p, float v) { *p = bf16_bits(v); }

}  // namespace mfsdp::cuda_detail
