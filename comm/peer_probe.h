// Which peers of a failed collective are still alive: a liveness probe over a communicator's own
// duplicate, answered by every rank that is waiting in a collective of any communicator, and the
// bounded abort that follows a fatal communication error. Internal to comm/.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace mfsdp::detail {

/// Seconds a failing rank waits for its peers' answers to the liveness probe.
inline constexpr double kPeerProbeSeconds = 2.0;
/// Seconds MPI_Abort gets to end the process before the process ends itself (_exit): on a node
/// cut off from the launcher, MPI_Abort can wait for it without end.
inline constexpr double kAbortGraceSeconds = 5.0;

/// One communicator's probe: a duplicate of `comm` (so pings never match the collectives'
/// messages), each member's world rank and host name. Construction is collective over `comm`
/// (MPI_Comm_dup, MPI_Allgather); the probe registers itself so that answer_pings() serves it.
class PeerProbe {
 public:
  explicit PeerProbe(MPI_Comm comm);
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  /// Pings every other member and waits up to `seconds` for the answers, answering pings
  /// itself meanwhile. Returns e.g. "no answer within 2 s from node1 (ranks 2, 3); answered:
  /// node0 (rank 1)", ranks being world ranks; when every peer answers, it names the slowest
  /// answer and its time (a crawling link).
  std::string probe(double seconds);
  /// "node0", this process's host name.
  const std::string& my_node() const { return nodes_[static_cast<size_t>(rank_)]; }
  MPI_Comm parent() const { return parent_; }

  /// Answers the pings that have arrived on every live probe of this process. Called by every
  /// wait loop, so a rank blocked in a collective still answers. Main thread only.
  static void answer_pings();
  /// The live probe made for `comm`, or nullptr.
  static PeerProbe* find(MPI_Comm comm);

 private:
  void answer();
  MPI_Comm parent_ = MPI_COMM_NULL, probe_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  std::vector<std::string> nodes_;
  std::vector<MPI_Request> answers_;  // pongs in flight
};

/// Ends the process with `exit_code` after kAbortGraceSeconds unless something else has ended it
/// first: started just before MPI_Abort, so no rank lingers on a partitioned node.
void end_process_after_grace(int exit_code);

}  // namespace mfsdp::detail
