// CUDA event timing shared by mfsdp-bench-cuda and the GPU calibration (CUDA builds only).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace mfsdp::cuda_timing {

/// Throws std::runtime_error "[bench] <what>: <CUDA error string>" unless `e` is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("[bench] ") + what + ": " + cudaGetErrorString(e));
}

/// Median milliseconds of `fn` between two CUDA events on the legacy default stream, after
/// `warmup` untimed calls and a device synchronize; `reps` >= 1 timed calls.
inline double median_ms(const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, reps); ++i) {
    check(cudaEventRecord(a, 0), "cudaEventRecord");
    fn();
    check(cudaEventRecord(b, 0), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace mfsdp::cuda_timing
