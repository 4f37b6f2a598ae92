// A build without cuDNN or without the cuDNN frontend headers: every call throws.
#include <stdexcept>
#include <string>

#include "runtime/cuda/cudnn_attention.h"

namespace mfsdp::cuda_cudnn {
namespace {

[[noreturn]] void unavailable(const char* op) {
  throw std::runtime_error(std::string("[") + op +
                           "] built without cuDNN: run scripts/fetch_cudnn_frontend.sh and reconfigure");
}

}  // namespace

bool built() { return false; }

void forward(const void*, const void*, const void*, void*, float*, const Dims&, void*) {
  unavailable("cudnn_attention_forward");
}

void backward(const void*, const void*, const void*, const void*, const void*, const float*, void*, void*, void*,
              const Dims&, void*) {
  unavailable("cudnn_attention_backward");
}

}  // namespace mfsdp::cuda_cudnn
