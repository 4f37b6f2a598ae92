// CPU-only build: the CUDA device API reports no device and refuses every device operation.
#include <stdexcept>

#include "runtime/cuda/device_api.h"

namespace mfsdp::cuda {
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw std::runtime_error(std::string("[") + op + "] MatrixFSDP was built without CUDA (MFSDP_CUDA=OFF)");
}
}  // namespace
bool built() { return false; }
int device_count() { return 0; }
void* malloc_device(int64_t) { no_cuda("cuda::malloc_device"); }
void free_device(void*) { no_cuda("cuda::free_device"); }
void copy_h2d(void*, const void*, int64_t) { no_cuda("cuda::copy_h2d"); }
void copy_d2h(void*, const void*, int64_t) { no_cuda("cuda::copy_d2h"); }
void copy_d2d(void*, const void*, int64_t) { no_cuda("cuda::copy_d2d"); }
void memset_device(void*, int, int64_t) { no_cuda("cuda::memset_device"); }
void synchronize() { no_cuda("cuda::synchronize"); }
void memory_info(int64_t&, int64_t&) { no_cuda("cuda::memory_info"); }
void* compute_stream() { no_cuda("cuda::compute_stream"); }
void* cublas_handle() { no_cuda("cuda::cublas_handle"); }
}  // namespace mfsdp::cuda
