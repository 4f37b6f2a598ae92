// The communicator backends by name (config key sharding.backend). Header-only, so config parsers
// need neither MPI nor CUDA to read the name.
#pragma once
#include <stdexcept>
#include <string>

#include "runtime/core/dtype.h"
#include "runtime/core/name_table.h"

namespace mfsdp {

/// The communicator backends:
///   mpi          host buffers, MPI collectives (Device::CPU)
///   cuda_staged  CUDA buffers copied through host memory and reduced by the MPI backend; several
///                ranks may share one GPU (Device::CUDA)
///   nccl         CUDA buffers, NCCL bootstrapped over MPI, one GPU per local rank (Device::CUDA)
enum class CommBackend { mpi, cuda_staged, nccl };

/// "mpi", "cuda_staged", "nccl".
inline constexpr NameTable<CommBackend, 3> kCommBackendNames{
    {{{CommBackend::mpi, "mpi"}, {CommBackend::cuda_staged, "cuda_staged"}, {CommBackend::nccl, "nccl"}}}};

/// Parses a name of kCommBackendNames; throws std::invalid_argument naming the value otherwise.
inline CommBackend parse_comm_backend(const std::string& s) { return kCommBackendNames.parse(s, "communicator backend"); }

/// The config name of `b`.
inline const char* comm_backend_name(CommBackend b) { return kCommBackendNames.name(b); }

/// The device whose buffers backend `b` moves (mpi: CPU, the others: CUDA).
inline Device comm_backend_device(CommBackend b) { return b == CommBackend::mpi ? Device::CPU : Device::CUDA; }

}  // namespace mfsdp
