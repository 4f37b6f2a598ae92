// Timeline marks on CUDA ranks: one cudaEvent per mark, recorded on the compute stream where the
// span begins or ends, and resolved after the window against an origin event (built with CUDA
// only; trace_clock_cuda_stub.cpp otherwise). Events are pooled across windows.
#include <cuda_runtime.h>

#include "runtime/core/cuda_check.h"
#include "runtime/cuda/device_api.h"
#include "runtime/trace/trace_clock.h"

namespace mfsdp::trace {
namespace {

class CudaClock final : public Clock {
 public:
  ~CudaClock() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  void start() override {
    used_ = 0;
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    origin_ = next();
    CUDA_CHECK(cudaEventRecord(origin_, stream()));
  }
  int64_t mark() override {
    cudaEvent_t e = next();
    CUDA_CHECK(cudaEventRecord(e, stream()));
    return static_cast<int64_t>(used_) - 2;  // pool_[0] is the origin
  }
  std::vector<int64_t> resolve() override {
    std::vector<int64_t> ns;
    if (used_ == 0) return ns;
    CUDA_CHECK(cudaEventSynchronize(pool_[used_ - 1]));
    for (size_t i = 1; i < used_; ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, origin_, pool_[i]));
      ns.push_back(static_cast<int64_t>(static_cast<double>(ms) * 1e6));
    }
    return ns;
  }

 private:
  static cudaStream_t stream() { return static_cast<cudaStream_t>(cuda::compute_stream()); }
  cudaEvent_t next() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  cudaEvent_t origin_ = nullptr;
};

}  // namespace

std::unique_ptr<Clock> make_cuda_clock() { return std::make_unique<CudaClock>(); }

}  // namespace mfsdp::trace
