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

}  // namespace mfsdp::cuda_detail
