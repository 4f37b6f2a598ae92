// CUDA build of the thin device API (device_api.h): every CUDA runtime call is checked and turned
// into a std::runtime_error naming the call, file:line and the CUDA error string.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>

#include <stdexcept>
#include <string>

#include "runtime/core/cuda_check.h"
#include "runtime/cuda/device_api.h"

namespace mfsdp::cuda {
namespace {
void check_bytes(int64_t bytes, const char* op) {
  if (bytes < 0) throw std::invalid_argument(std::string("[") + op + "] negative size " + std::to_string(bytes) + " bytes");
}
}  // namespace

bool built() { return true; }

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: report none instead of throwing
    return 0;
  }
  return n;
}

void* malloc_device(int64_t bytes) {
  check_bytes(bytes, "cuda::malloc_device");
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    std::string mem;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      mem = " (" + std::to_string(free_b) + " of " + std::to_string(total_b) + " bytes free)";
    else
      (void)cudaGetLastError();
    throw std::runtime_error("[cuda::malloc_device] cudaMalloc of " + std::to_string(bytes) + " bytes failed at " +
                             __FILE__ + ":" + std::to_string(__LINE__) + ": " + cudaGetErrorString(e) + mem);
  }
  return p;
}

void memory_info(int64_t& free_bytes, int64_t& total_bytes) {
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  free_bytes = static_cast<int64_t>(free_b);
  total_bytes = static_cast<int64_t>(total_b);
}

void free_device(void* p) {
  if (p) CUDA_CHECK(cudaFree(p));
}

void copy_h2d(void* dst, const void* src, int64_t bytes) {
  check_bytes(bytes, "cuda::copy_h2d");
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice));
}

void copy_d2h(void* dst, const void* src, int64_t bytes) {
  check_bytes(bytes, "cuda::copy_d2h");
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost));
}

void copy_d2d(void* dst, const void* src, int64_t bytes) {
  check_bytes(bytes, "cuda::copy_d2d");
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice));
}

void memset_device(void* p, int value, int64_t bytes) {
  check_bytes(bytes, "cuda::memset_device");
  if (bytes) CUDA_CHECK(cudaMemset(p, value, static_cast<size_t>(bytes)));
}

void synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

void* compute_stream() { return nullptr; }  // the legacy default stream

void* cublas_handle() {
  static std::mutex mu;
  static cublasHandle_t handle = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!handle) {
    CUBLAS_CHECK(cublasCreate(&handle));
    CUBLAS_CHECK(cublasSetStream(handle, static_cast<cudaStream_t>(compute_stream())));
    CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));  // plain FP32, no TF32
  }
  return handle;
}

}  // namespace mfsdp::cuda
