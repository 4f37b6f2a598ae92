// The collective timeout of a non-blocking NCCL communicator (internal; CUDA builds only). Its
// calls return once the work is enqueued, so a rank that never joins shows up later, inside a
// compute-stream copy that would wait forever. A watchdog thread polls the done-event of the
// oldest unfinished collective and NCCL's asynchronous error state; a collective still running
// after the timeout, or an asynchronous error, aborts the communicator and the job with the
// usual "[comm] rank R: ... in op(...)" report.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace mfsdp::detail {

class NcclWatchdog {
 public:
  /// Starts the thread. `comm` is polled with ncclCommGetAsyncError and aborted on a failure;
  /// `rank` names this rank in the report, `timeout_name` the bound (CommOptions::timeout_name).
  NcclWatchdog(ncclComm_t comm, int rank, double timeout_seconds, std::string timeout_name);
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  /// Watches the work enqueued on `stream` so far (an event recorded there), described by `what`
  /// (CallInfo::describe()). Returns the cudaRecord error, if any.
  cudaError_t watch(cudaStream_t stream, std::string what);
  /// Replaces the timeout and its name for the collectives watched from now on and those pending.
  void set_timeout(double seconds, std::string name);
  /// Stops watching (before the communicator is destroyed or aborted by its owner).
  void stop();

 private:
  struct Entry {
    cudaEvent_t done = nullptr;
    double enqueued = 0;
    std::string what;
  };
  void run();
  [[noreturn]] void fail(const std::string& what, const std::string& call);

  ncclComm_t comm_;
  int rank_;
  double timeout_;          // guarded by mu_
  std::string timeout_name_;  // guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> pending_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mfsdp::detail
