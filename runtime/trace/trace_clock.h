// Time marks of the per-rank timeline (runtime/trace/trace.h): on CPU ranks steady-clock
// readings, on CUDA ranks events recorded on the compute stream and read after the window.
// Kept free of C++20 and of the rest of the project so that the CUDA implementation compiles
// with nvcc's C++17.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace mfsdp::trace {

/// A source of time marks. Not thread-safe: marks are taken on the thread that runs the step.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Starts a window: the time origin is now (CPU) or the point the compute stream reaches now,
  /// after waiting for the work queued so far (CUDA). Forgets earlier marks.
  virtual void start() = 0;
  /// Takes a mark and returns its index (0, 1, 2, ... within the window).
  virtual int64_t mark() = 0;
  /// Nanoseconds from the origin to each mark, in mark order. CUDA: waits for the last mark.
  virtual std::vector<int64_t> resolve() = 0;
};

/// Steady-clock marks (runtime/core/clock.h's clock), read at once.
std::unique_ptr<Clock> make_host_clock();
/// cudaEvent marks on the compute stream (runtime/cuda/device_api.h compute_stream()), resolved
/// with cudaEventElapsedTime against an origin event. Built without CUDA: throws
/// std::runtime_error("built without CUDA") (trace_clock_cuda_stub.cpp).
std::unique_ptr<Clock> make_cuda_clock();

}  // namespace mfsdp::trace
