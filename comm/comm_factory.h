// Making communicators without MPI types: the process-level MPI session, the backend names a
// config uses, and one factory over the MPI world. Communicators over other MPI communicators
// (tests, sub-groups) come from comm/mpi_backends.h.
#pragma once
#include <memory>
#include <string>

#include "comm/comm_backend.h"
#include "comm/communicator.h"

namespace mfsdp {

/// Process-level MPI lifetime: MPI_Init_thread(MPI_THREAD_FUNNELED) unless MPI is already
/// initialised, and MPI_Finalize in the destructor only if this object initialised it.
/// A world of 1 works without mpirun (singleton init).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  MpiSession() : MpiSession(nullptr, nullptr) {}
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  bool owns_mpi() const { return owns_; }

 private:
  bool owns_ = false;
};

/// Options of the CUDA backends. `compute_stream` is a cudaStream_t (nullptr = legacy default
/// stream): collectives start after the work already queued on it, and work queued on it
/// afterwards starts after the collective.
struct CudaCommOptions {
  void* compute_stream = nullptr;
  /// NCCL only: true = each call waits for its communication to finish (seconds are exact and
  /// errors/timeouts are detected in the call); false = calls only enqueue on the comm stream.
  bool blocking = true;
};


/// A communicator of backend `b` over all MPI processes (MPI must be initialised, e.g. by an
/// MpiSession). The CUDA backends select this rank's GPU first: nccl uses GPU local_rank and
/// throws when there are fewer GPUs than local ranks; cuda_staged uses GPU local_rank % count.
/// Throws std::runtime_error when built without CUDA and `b` is not mpi, or when no GPU is found.
std::unique_ptr<Communicator> make_communicator(CommBackend b, CommOptions opts = {},
                                                CudaCommOptions cuda = {});

/// A communicator of backend `b` over the MPI processes of the world that pass the same `color`
/// (MPI_Comm_split of MPI_COMM_WORLD; ranks ordered by `key`, then world rank). Collective over
/// the whole world: every process calls it, each with its own color and key (color >= 0).
/// Throws std::invalid_argument for a negative color, and what make_communicator throws.
std::unique_ptr<Communicator> make_split_communicator(CommBackend b, int color, int key, CommOptions opts = {},
                                                      CudaCommOptions cuda = {});

/// The two groups of HSDP (replicate x shard) over a world of W = R * S processes: world rank
/// g = q * S + s is shard rank s of replica q. `shard` holds the S ranks of replica q (rank s),
/// `replica` the R ranks with shard rank s (rank q). Collective over the world.
struct HsdpGroups {
  std::unique_ptr<Communicator> shard, replica;
  int replicas = 1;  ///< R
};

/// Splits the world into `replicas` replicas of world/replicas shard ranks (two
/// make_split_communicator calls). Throws std::invalid_argument when replicas < 1 or does not
/// divide the world size. Note for NCCL: each group selects the GPU of its own local rank, so the
/// replica group (one rank per node and shard rank) is only right when every node runs one shard
/// group; the MPI backend has no such restriction.
HsdpGroups make_hsdp_groups(CommBackend b, int replicas, CommOptions opts = {}, CudaCommOptions cuda = {});

}  // namespace mfsdp
