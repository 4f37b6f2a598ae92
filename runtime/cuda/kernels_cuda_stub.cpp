// CPU-only build: the CUDA backend (kernels_cuda.cu) and its bf16 GEMMs (gemm_bf16.cu) refuse to run.
#include <stdexcept>

#include "runtime/cuda/gemm_bf16.h"
#include "runtime/kernels.h"

namespace mfsdp {
Kernels& cuda_kernels() {
  throw std::runtime_error("[kernels] CUDA tensors are not available: MatrixFSDP was built without CUDA");
}

namespace cuda_gemm {
void gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const void*, const void*, float, float*) {
  throw std::runtime_error("[gemm_bf16] MatrixFSDP was built without CUDA");
}
void gemm_bf16_gemmex(bool, bool, int64_t, int64_t, int64_t, float, const void*, const void*, float, float*) {
  throw std::runtime_error("[gemm_bf16_gemmex] MatrixFSDP was built without CUDA");
}
}  // namespace cuda_gemm
}  // namespace mfsdp
