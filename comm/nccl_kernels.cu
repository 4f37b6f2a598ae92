// Rank-ordered reduction kernel for the NCCL backend's deterministic reduce_scatter(_v).
#include <cstdint>

#include "comm/nccl_kernels.h"

namespace mfsdp::detail {
namespace {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
// Same rounding as float_to_bf16 in comm/dtype.h (nearest even; NaN stays quiet NaN).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename T>
__device__ __forceinline__ float load_f32(const T* p, int64_t i);
template <>
__device__ __forceinline__ float load_f32<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load_f32<uint16_t>(const uint16_t* p, int64_t i) {
  return bf16_bits_to_f32(p[i]);
}

// T: the contributions' type; O: the output's (T, or float for accumulate).
template <typename T, typename O>
__global__ void ordered_reduce_kernel(const T* stage, int64_t stride, const T* own, int own_index,
                                      int nsrc, O* out, int64_t n, int op) {
  // op: 0 sum, 1 mean, 2 max, 3 accumulate (O = float; start from out's value)
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float acc;
    if (op == 2) {
      acc = load_f32(own_index == 0 ? own : stage, i);
      for (int j = 1; j < nsrc; ++j) acc = fmaxf(acc, load_f32(j == own_index ? own : stage + j * stride, i));
    } else {
      acc = op == 3 ? load_f32(out, i) : 0.0f;
      for (int j = 0; j < nsrc; ++j) acc = acc + load_f32(j == own_index ? own : stage + j * stride, i);
      if (op == 1) acc = acc / static_cast<float>(nsrc);
    }
    if constexpr (sizeof(O) == 4) out[i] = acc;
    else out[i] = f32_to_bf16_bits(acc);
  }
}

}  // namespace

void launch_ordered_reduce(const void* stage, int64_t stride, const void* own, int own_index,
                           int nsrc, void* out, int64_t n, DType dt, ReduceOp op,
                           cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = 256;
  const int64_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 65535 ? want : 65535);
  const int o = op == ReduceOp::sum ? 0 : op == ReduceOp::mean ? 1 : op == ReduceOp::max ? 2 : 3;
  if (dt == DType::f32)
    ordered_reduce_kernel<float, float><<<blocks, threads, 0, stream>>>(
        static_cast<const float*>(stage), stride, static_cast<const float*>(own), own_index, nsrc,
        static_cast<float*>(out), n, o);
  else if (op == ReduceOp::accumulate)  // bf16 contributions onto f32 running sums
    ordered_reduce_kernel<uint16_t, float><<<blocks, threads, 0, stream>>>(
        static_cast<const uint16_t*>(stage), stride, static_cast<const uint16_t*>(own), own_index,
        nsrc, static_cast<float*>(out), n, o);
  else
    ordered_reduce_kernel<uint16_t, uint16_t><<<blocks, threads, 0, stream>>>(
        static_cast<const uint16_t*>(stage), stride, static_cast<const uint16_t*>(own), own_index,
        nsrc, static_cast<uint16_t*>(out), n, o);
}

}  // namespace mfsdp::detail
