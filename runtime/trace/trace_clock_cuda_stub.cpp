// make_cuda_clock in a build without CUDA (trace_clock_cuda.cu replaces this file with CUDA).
#include <stdexcept>

#include "runtime/trace/trace_clock.h"

namespace mfsdp::trace {

std::unique_ptr<Clock> make_cuda_clock() { throw std::runtime_error("logging.trace on a CUDA device: built without CUDA"); }

}  // namespace mfsdp::trace
