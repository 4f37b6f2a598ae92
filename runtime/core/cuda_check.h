// The one CUDA / cuBLAS error-check family of the project (runtime/cuda, optim and comm .cu files). Internal header:
// include only from .cu files compiled with MFSDP_WITH_CUDA.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace mfsdp::cuda::detail {

/// Throws std::runtime_error "[cuda] <call> failed at file:line: <cudaGetErrorString>".
inline void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  throw std::runtime_error(std::string("[cuda] ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": " + cudaGetErrorString(e));
}

/// Throws std::runtime_error "[cublas] <call> failed at file:line: status N (name)".
inline void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string("[cublas] ") + call + " failed at " + file + ":" + std::to_string(line) +
                           ": status " + std::to_string(static_cast<int>(s)) + " (" + cublasGetStatusName(s) + ")");
}

}  // namespace mfsdp::cuda::detail

#define CUDA_CHECK(call) ::mfsdp::cuda::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::mfsdp::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)
/// Checks the launch of the kernel just issued (configuration errors); `what` names the kernel.
#define CUDA_CHECK_LAUNCH(what) ::mfsdp::cuda::detail::check_cuda(cudaGetLastError(), what, __FILE__, __LINE__)
