// The backend constructors over an explicit MPI communicator (tests use MPI_COMM_SELF and
// sub-communicators). Applications use make_communicator (comm/comm_factory.h) instead.
#pragma once
#include <mpi.h>

#include <memory>

#include "comm/comm_factory.h"

namespace mfsdp {

/// MPI backend over a duplicate of `comm` (host buffers). Sets MPI_ERRORS_RETURN on the duplicate.
/// Throws std::runtime_error if MPI is not initialised or options are invalid.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD,
                                                    CommOptions opts = {});

/// CUDA buffers staged through host memory and reduced by the MPI backend (several ranks may share
/// one GPU). Uses the process's device: select_device_for_process() (comm/comm_factory.h) must
/// have been called on every rank of the world first. Throws std::runtime_error when built
/// without CUDA or when no device was selected (or the current device is another one).
std::unique_ptr<Communicator> make_cuda_staged_communicator(MPI_Comm comm = MPI_COMM_WORLD,
                                                            CommOptions opts = {},
                                                            CudaCommOptions cuda = {});

/// NCCL backend bootstrapped by MPI: rank 0 ncclGetUniqueId, MPI_Bcast, ncclCommInitRankConfig
/// (non-blocking unless `cuda.blocking`) on the process's device, which
/// select_device_for_process() (comm/comm_factory.h) must have chosen on every rank of the world
/// first. Throws std::runtime_error when built without CUDA, when no device was selected, or
/// when the node runs more processes than it has GPUs (NCCL needs one GPU per rank).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm = MPI_COMM_WORLD,
                                                     CommOptions opts = {},
                                                     CudaCommOptions cuda = {});

/// Backend `b` over a duplicate of `comm`: the one place that maps a CommBackend to its
/// constructor above (make_communicator and make_split_communicator use it). The CUDA backends
/// need select_device_for_process() first, as above. Throws what the constructor throws.
std::unique_ptr<Communicator> make_communicator_over(CommBackend b, MPI_Comm comm, CommOptions opts = {},
                                                     CudaCommOptions cuda = {});

}  // namespace mfsdp
