// CPU-only build: the CUDA backend refuses to run.
#include <stdexcept>

#include "runtime/kernels.h"

namespace mfsdp {
Kernels& cuda_kernels() {
  throw std::runtime_error("[kernels] CUDA tensors are not available: MatrixFSDP was built without CUDA");
}
}  // namespace mfsdp
