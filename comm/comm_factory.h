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

/// A communicator for small host data over all MPI processes (the MPI backend, Device::CPU),
/// usable before the training backend exists and without selecting a device: start-up checks,
/// agreements and flags, node-local layout (local_rank / local_size). Its waits are bounded by
/// opts.timeout_seconds, changeable later with set_timeout. Collective over the world (a
/// duplicate of it and a node split; no data moves). MPI must be initialised (an MpiSession).
/// Throws std::runtime_error when it is not, std::invalid_argument for invalid options.
std::unique_ptr<Communicator> make_host_communicator(CommOptions opts = {});

/// Ends every process of the job with `exit_code` (MPI_Abort on the world), after flushing
/// stdout and stderr: for a failure on one rank that the others cannot learn of in time.
[[noreturn]] void abort_job(int exit_code);

/// Options of the CUDA backends. `compute_stream` is a cudaStream_t (nullptr = legacy default
/// stream): collectives start after the work already queued on it, and work queued on it
/// afterwards starts after the collective.
struct CudaCommOptions {
  void* compute_stream = nullptr;
  /// NCCL only. false (the default): a non-blocking NCCL communicator (ncclConfig_t::blocking =
  /// 0) whose calls only enqueue on the comm stream; NCCL's ncclInProgress states are polled
  /// with ncclCommGetAsyncError, and a watchdog thread aborts the job when a collective is still
  /// unfinished after CommOptions::timeout_seconds or NCCL reports an asynchronous error.
  /// true (diagnostics; config key sharding.nccl_blocking): a blocking NCCL communicator, and
  /// each call waits for its communication to finish (seconds are exact, errors and timeouts
  /// are reported by the call that caused them).
  bool blocking = false;
};

/// The CUDA device of this process, chosen once by select_device_for_process().
struct ProcessDevice {
  int device = -1;        ///< the CUDA device; -1 while none has been selected
  int local_rank = 0;     ///< rank among the world's processes on this node
  int local_size = 1;     ///< the world's processes on this node
  int device_count = 0;   ///< CUDA devices visible to this process
};

/// Selects this process's CUDA device once: device = node-local rank of MPI_COMM_WORLD
/// (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)) modulo the visible devices, then cudaSetDevice.
/// The first call is collective over MPI_COMM_WORLD (every process must make it); later calls
/// return the first result without communicating. Every CUDA communicator, whatever group it
/// spans (HSDP's shard and replica groups, MPI_COMM_SELF), uses this device and never selects
/// another. Throws std::runtime_error when built without CUDA, when MPI is not initialised or
/// when no device is visible.
ProcessDevice select_device_for_process();

/// The selection made by select_device_for_process() (device -1 when none was made).
ProcessDevice selected_process_device();

/// Makes the selected device current on the calling thread (a new thread starts on device 0);
/// for helper threads of the communicators. Throws when no device was selected.
void bind_thread_to_process_device();

/// A communicator of backend `b` over all MPI processes (MPI must be initialised, e.g. by an
/// MpiSession). For the CUDA backends it first calls select_device_for_process() (collective
/// over the world on the first call); nccl then throws when a node runs more processes than it
/// has GPUs, cuda_staged lets processes share GPUs (local rank modulo the GPU count).
/// Throws std::runtime_error when built without CUDA and `b` is not mpi, or when no GPU is found.
std::unique_ptr<Communicator> make_communicator(CommBackend b, CommOptions opts = {},
                                                CudaCommOptions cuda = {});

/// A communicator of backend `b` over the MPI processes of the world that pass the same `color`
/// (MPI_Comm_split of MPI_COMM_WORLD; ranks ordered by `key`, then world rank). Collective over
/// the whole world: every process calls it, each with its own color and key (color >= 0). The
/// CUDA backends select the process's device first, as make_communicator.
/// Throws std::invalid_argument for a negative color, and what make_communicator throws.
std::unique_ptr<Communicator> make_split_communicator(CommBackend b, int color, int key, CommOptions opts = {},
                                                      CudaCommOptions cuda = {});

/// The two groups of HSDP (replicate x shard) over a world of W = R * S processes: `shard` holds
/// the S ranks of replica q (this process is its rank s), `replica` the R ranks with shard rank s
/// (rank q). Collective over the world.
struct HsdpGroups {
  std::unique_ptr<Communicator> shard, replica;
  int replicas = 1;  ///< R
  /// How the groups lie on the nodes, for the start-up log: "each shard group on one node" or
  /// the first shard group that spans nodes and the layout that would avoid it.
  std::string layout;
  bool spans_nodes = false;  ///< some shard group has ranks on more than one node
};

/// Splits the world into `replicas` replicas of world/replicas shard ranks (two
/// make_split_communicator calls). The standard layout shards within a node and replicates
/// across nodes: when R equals the node count and every node runs S ranks, replica q is node q
/// and shard rank s its node-local rank s, whatever order the launcher numbered the ranks in.
/// Otherwise world rank q * S + s is shard rank s of replica q. Throws std::invalid_argument when
/// replicas < 1 or does not divide the world size. Both groups use the device the process
/// selected from its world node-local rank (select_device_for_process), so they agree on the GPU.
HsdpGroups make_hsdp_groups(CommBackend b, int replicas, CommOptions opts = {}, CudaCommOptions cuda = {});

}  // namespace mfsdp
