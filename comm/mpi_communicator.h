// MPI backend of the Communicator (host buffers). Public so the CUDA backends can reuse it.
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/comm_detail.h"
#include "comm/communicator.h"
#include "comm/mpi_backends.h"
#include "comm/peer_probe.h"

namespace mfsdp {

/// Communicator over a duplicate of an MPI communicator (MPI_ERRORS_RETURN set on it).
/// Gathers use MPI_Iallgatherv when the total fits max_message_elements, otherwise chunked
/// point-to-point messages. reduce_scatter(_v) is the rank-ordered, chunked owner reduction
/// documented in communicator.h. In place is allowed in two forms: all_gather_v with
/// send == recv + offset of this rank, reduce_scatter_v with recv == send + offset of this rank.
class MpiCommunicator final : public Communicator {
 public:
  /// Throws std::runtime_error when MPI is not initialised or `opts` is invalid.
  explicit MpiCommunicator(MPI_Comm comm, CommOptions opts = {});
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  Device device() const override { return Device::CPU; }
  const char* backend_name() const override { return "mpi"; }

  void all_gather(const void* send, void* recv, int64_t count, DType dt, CommPhase ph) override;
  void all_gather_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                    CommPhase ph) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, ReduceOp op,
                      CommPhase ph) override;
  void reduce_scatter_v(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                        ReduceOp op, CommPhase ph) override;
  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, CommPhase ph) override;
  double all_reduce_scalar(double value, ReduceOp op, CommPhase ph) override;
  void all_gather_host(const void* send, void* recv, int64_t bytes, CommPhase ph) override;
  void broadcast(void* buf, int64_t count, DType dt, int root, CommPhase ph) override;
  void barrier() override;
  void set_timeout(double seconds, const std::string& name) override;
  void send_recv(const std::vector<P2P>& ops, CommPhase ph) override;
  /// MPI_Iallgatherv; MPI_Wait (polled, with the collective timeout) in wait().
  std::unique_ptr<PendingCollective> start_all_gather_v(const void* send, void* recv,
                                                        const std::vector<int64_t>& counts, DType dt,
                                                        CommPhase ph) override;
  /// Posts the first round's messages (at most reduce_chunk_bytes per contributing rank, in the
  /// handle's own staging) and returns; wait() waits for them (polled, with the collective
  /// timeout), reduces them in rank order, then runs any further rounds blocking. Bitwise equal
  /// to reduce_scatter_v. Between start and wait, MPI progresses the messages only inside MPI calls.
  std::unique_ptr<PendingCollective> start_reduce_scatter_v(const void* send, void* recv,
                                                            const std::vector<int64_t>& counts, DType dt,
                                                            ReduceOp op, CommPhase ph) override;

  /// The duplicated communicator this backend talks over.
  MPI_Comm mpi_comm() const { return comm_; }
  const CommOptions& options() const { return opts_; }
  /// Adds one call's traffic and time to the counters (used by wrapping backends).
  void account(CommPhase ph, const detail::Traffic& t, double seconds);
  /// Debug-mode signature exchange for one collective (no-op unless debug checks are on).
  void debug_check(const detail::CallInfo& call);

 private:
  struct PendingReduce;  // a start_reduce_scatter_v handle
  friend struct PendingReduce;
  void finish_started_reduce(PendingReduce& p);
  void gather_v_impl(const void* send, void* recv, const std::vector<int64_t>& counts, DType dt,
                     const detail::CallInfo& call);
  /// The rank-ordered owner reduction from round `first_round` on (rounds of `chunk` elements
  /// per contributing rank; every rank computes the same number of rounds).
  void reduce_scatter_v_impl(const void* send, void* recv, const std::vector<int64_t>& counts,
                             DType dt, ReduceOp op, const detail::CallInfo& call, int64_t first_round = 0);
  struct ReduceRounds {
    int64_t chunk = 1, rounds = 0, my_chunk = 0;
  };
  ReduceRounds reduce_rounds(const std::vector<int64_t>& counts, DType dt) const;
  /// Posts round k: this rank's receives into `stage` (my_chunk elements per peer) and its sends.
  void post_reduce_round(int64_t k, const ReduceRounds& r, const void* send, const std::vector<int64_t>& counts,
                         DType dt, const detail::CallInfo& call, unsigned char* stage,
                         std::vector<MPI_Request>& reqs, int tag);
  /// Adds round k's contributions (this rank's own from `send`, the others from `stage`) in rank order.
  void finish_reduce_round(int64_t k, const ReduceRounds& r, const void* send, void* recv,
                           const std::vector<int64_t>& counts, DType dt, ReduceOp op, const unsigned char* stage);
  void post_send(const void* buf, int64_t count, DType dt, int peer, const detail::CallInfo& call,
                 std::vector<MPI_Request>& reqs, int tag);
  void post_recv(void* buf, int64_t count, DType dt, int peer, const detail::CallInfo& call,
                 std::vector<MPI_Request>& reqs, int tag);
  void wait_all(const detail::CallInfo& call);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  CommOptions opts_;
  int64_t seq_ = 0;
  std::vector<MPI_Request> reqs_;
  std::vector<unsigned char> stage_;
  std::vector<std::vector<unsigned char>> spare_stages_;  ///< staging of finished started reductions, reused
  std::vector<float> acc_;
  std::unique_ptr<detail::PeerProbe> probe_;  ///< names the peers that still answer when a call fails
};

}  // namespace mfsdp
