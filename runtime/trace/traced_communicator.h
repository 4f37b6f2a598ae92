// A Communicator that records each collective it forwards on the active timeline
// (runtime/trace/trace.h): the one place collectives are traced, whatever the backend.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mfsdp::trace {

/// Forwards every call to `inner` (which must outlive it). While a recorder is active, each
/// blocking collective becomes a span on the collectives lane, and each started one a span from
/// its start to the end of its wait() on the prefetch lane (all-gathers) or the reduce lane
/// (reduce-scatters). Args: op, phase, dtype, elements, bytes and bytes_received (this rank's
/// direct-model bytes of the call, comm/communicator.h). Its counters() hold the traffic of the
/// calls made through it (reset_counters() resets only those); `inner`'s count them as well.
class TracedCommunicator final : public Communicator {
 public:
  explicit TracedCommunicator(Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  int local_rank() const override { return inner_.local_rank(); }
  int local_size() const override { return inner_.local_size(); }
  Device device() const override { return inner_.device(); }
  const char* backend_name() const override { return inner_.backend_name(); }

  void all_gather(const void* send, void* recv, int64_t count, DType dt, CommPhase ph) override;
  void all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                    CommPhase ph) override;
  std::unique_ptr<PendingCollective> start_all_gather_v(const void* send, void* recv,
                                                        const std::vector<int64_t>& counts, DType dt,
                                                        CommPhase ph) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op, CommPhase ph) override;
  void reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt, ReduceOp op,
                        CommPhase ph) override;
  std::unique_ptr<PendingCollective> start_reduce_scatter_v(const void* send, void* recv,
                                                            const std::vector<int64_t>& counts, DType dt,
                                                            ReduceOp op, CommPhase ph) override;
  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, CommPhase ph) override;
  double all_reduce_scalar(double value, ReduceOp op, CommPhase ph) override;
  void all_gather_host(const void* send, void* recv, int64_t bytes, CommPhase ph) override;
  void broadcast(void* buf, int64_t count, DType dt, int root, CommPhase ph) override;
  void barrier() override;
  void set_timeout(double seconds, const std::string& name) override { inner_.set_timeout(seconds, name); }
  void send_recv(const std::vector<P2P>& ops, CommPhase ph) override;

 private:
  /// What one call is, for its span.
  struct Call {
    const char* op;
    CommPhase phase;
    DType dtype;
    int64_t elements;
  };
  template <class Fn>
  void traced(const Call& call, Fn&& fn);
  /// Adds inner_'s traffic since `before` to counters_; returns the args of that traffic.
  std::string absorb(const CommCounters& before, const Call& call);

  Communicator& inner_;
};

}  // namespace mfsdp::trace
