// The collective timeout of non-blocking NCCL communicators (see nccl_watchdog.h).
#include "comm/nccl_watchdog.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "comm/comm_detail.h"
#include "comm/comm_factory.h"
#include "comm/peer_probe.h"

namespace mfsdp::detail {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

NcclWatchdog::NcclWatchdog(ncclComm_t comm, int rank, double timeout_seconds, std::string timeout_name)
    : comm_(comm), rank_(rank), timeout_(timeout_seconds), timeout_name_(std::move(timeout_name)) {
  thread_ = std::thread([this] { run(); });
}

void NcclWatchdog::set_timeout(double seconds, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_ = seconds;
  timeout_name_ = std::move(name);
}

NcclWatchdog::~NcclWatchdog() { stop(); }

void NcclWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Entry& e : pending_) cudaEventDestroy(e.done);
  pending_.clear();
}

cudaError_t NcclWatchdog::watch(cudaStream_t stream, std::string what) {
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return e;
  e = cudaEventRecord(ev, stream);
  if (e != cudaSuccess) {
    cudaEventDestroy(ev);
    return e;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({ev, seconds_now(), std::move(what)});
  }
  cv_.notify_one();
  return cudaSuccess;
}

// Finished collectives leave the queue in order; the oldest unfinished one is timed. The thread
// works on the process's device (a new thread starts on device 0).
void NcclWatchdog::run() {
  try {
    bind_thread_to_process_device();
  } catch (const std::exception& e) {
    fail(e.what(), "the NCCL watchdog's start");
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 100 : 2));
    while (!stop_ && !pending_.empty()) {
      const cudaError_t q = cudaEventQuery(pending_.front().done);
      if (q == cudaErrorNotReady) break;
      if (q != cudaSuccess) fail(std::string("cudaEventQuery failed: ") + cudaGetErrorString(q), pending_.front().what);
      cudaEventDestroy(pending_.front().done);
      pending_.pop_front();
    }
    if (stop_ || pending_.empty()) continue;
    const std::string what = pending_.front().what;
    const double waited = seconds_now() - pending_.front().enqueued;
    const double timeout = timeout_;
    const std::string timeout_name = timeout_name_;
    lock.unlock();
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      fail(std::string("NCCL asynchronous error: ") + ncclGetErrorString(async), what);
    if (timeout > 0 && waited > timeout) fail(timeout_text(timeout, timeout_name), what);
    lock.lock();
  }
}

void NcclWatchdog::fail(const std::string& what, const std::string& call) {
  std::fprintf(stderr, "[comm] rank %d: %s in %s; aborting the job\n", rank_, what.c_str(), call.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  detail::end_process_after_grace(3);  // MPI_Abort may wait without end on a cut-off node
  ncclCommAbort(comm_);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();  // not reached
}

}  // namespace mfsdp::detail
