// Thin CUDA device API used by the runtime (allocation, copies, device queries).
// Built from cuda/device_api.cu when MFSDP_WITH_CUDA; otherwise every call except
// cuda_device_count() throws std::runtime_error("built without CUDA").
#pragma once
#include <cstdint>

namespace mfsdp::cuda {

/// True when this build has the CUDA backend (device_api.cu); false in a build without CUDA
/// (device_api_stub.cpp), whatever the machine has.
bool built();
/// Number of visible CUDA devices; 0 when built without CUDA or when the driver reports none.
int device_count();
/// True when at least one CUDA device can be used.
inline bool available() { return device_count() > 0; }
/// cudaMalloc / cudaFree. Throws std::runtime_error naming the size on failure.
void* malloc_device(int64_t bytes);
void free_device(void* p);
/// Synchronous copies (cudaMemcpy) host->device, device->host, device->device; bytes.
void copy_h2d(void* dst, const void* src, int64_t bytes);
void copy_d2h(void* dst, const void* src, int64_t bytes);
void copy_d2d(void* dst, const void* src, int64_t bytes);
void memset_device(void* p, int value, int64_t bytes);
/// Free and total bytes of the current device (cudaMemGetInfo). Throws std::runtime_error on failure.
void memory_info(int64_t& free_bytes, int64_t& total_bytes);
/// cudaDeviceSynchronize; throws on a sticky error.
void synchronize();

/// The one compute context of this process on its current device, shared by the kernels
/// (runtime/cuda), the optimizers (optim/step.h) and the communicators (their compute stream):
/// work is ordered on compute_stream(), the legacy default stream (returned as nullptr, a
/// cudaStream_t), and every cuBLAS call goes through cublas_handle() (a cublasHandle_t bound to
/// that stream, host pointer mode, plain FP32 math unless a call asks for another compute type),
/// created on first use, thread-safe. Both throw when built without CUDA.
void* compute_stream();
void* cublas_handle();

}  // namespace mfsdp::cuda
