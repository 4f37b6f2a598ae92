// The communicator backends by name (config key sharding.backend). Header-only, so config parsers
// need neither MPI nor CUDA to read the name.
#pragma once
#include <stdexcept>
#include <string>

#include "runtime/core/dtype.h"

namespace mfsdp {

/// The communicator backends:
///   mpi          host buffers, MPI collectives (Device::CPU)
///   cuda_staged  CUDA buffers copied through host memory and reduced by the MPI backend; several
///                ranks may share one GPU (Device::CUDA)
///   nccl         CUDA buffers, NCCL bootstrapped over MPI, one GPU per local rank (Device::CUDA)
enum class CommBackend { mpi, cuda_staged, nccl };

/// Parses "mpi" / "cuda_staged" / "nccl"; throws std::invalid_argument naming the value otherwise.
inline CommBackend parse_comm_backend(const std::string& s) {
  if (s == "mpi") return CommBackend::mpi;
  if (s == "cuda_staged") return CommBackend::cuda_staged;
  if (s == "nccl") return CommBackend::nccl;
  throw std::invalid_argument("unknown communicator backend '" + s + "' (expected mpi, cuda_staged or nccl)");
}

/// The config name of `b`.
inline const char* comm_backend_name(CommBackend b) {
  return b == CommBackend::mpi ? "mpi" : b == CommBackend::cuda_staged ? "cuda_staged" : "nccl";
}

/// The device whose buffers backend `b` moves (mpi: CPU, the others: CUDA).
inline Device comm_backend_device(CommBackend b) { return b == CommBackend::mpi ? Device::CPU : Device::CUDA; }

}  // namespace mfsdp
