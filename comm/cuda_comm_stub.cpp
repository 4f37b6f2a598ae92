// The CUDA parts of comm/comm_factory.h when MatrixFSDP is built without CUDA (CMake compiles this
// file instead of device_select.cpp and the CUDA communicators): no device is ever selected, and
// every call that needs one throws std::runtime_error naming the call.
#include <stdexcept>

#include "comm/comm_factory.h"
#include "comm/mpi_backends.h"

namespace mfsdp {

ProcessDevice select_device_for_process() {
  throw std::runtime_error("[select_device_for_process] MatrixFSDP was built without CUDA (MFSDP_CUDA=OFF)");
}

void bind_thread_to_process_device() {
  throw std::runtime_error("[bind_thread_to_process_device] MatrixFSDP was built without CUDA (MFSDP_CUDA=OFF)");
}

ProcessDevice selected_process_device() { return ProcessDevice{}; }

std::unique_ptr<Communicator> make_cuda_staged_communicator(MPI_Comm, CommOptions, CudaCommOptions) {
  throw std::runtime_error(
      "[make_cuda_staged_communicator] MatrixFSDP was built without CUDA (MFSDP_CUDA=OFF); "
      "use make_mpi_communicator for CPU buffers");
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, CommOptions, CudaCommOptions) {
  throw std::runtime_error(
      "[make_nccl_communicator] MatrixFSDP was built without CUDA (MFSDP_CUDA=OFF); "
      "use make_mpi_communicator for CPU buffers");
}

}  // namespace mfsdp
