#include "comm/comm_factory.h"

#include <mpi.h>

#include <stdexcept>
#include <string>

#include "comm/mpi_backends.h"

namespace mfsdp {

MpiSession::MpiSession(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw std::runtime_error("[MpiSession] MPI_Init_thread failed");
  owns_ = true;
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> make_communicator(CommBackend b, CommOptions opts, CudaCommOptions cuda) {
  switch (b) {
    case CommBackend::mpi: return make_mpi_communicator(MPI_COMM_WORLD, opts);
    case CommBackend::cuda_staged: return make_cuda_staged_communicator(MPI_COMM_WORLD, opts, cuda);
    case CommBackend::nccl: return make_nccl_communicator(MPI_COMM_WORLD, opts, cuda);
  }
  throw std::invalid_argument("[make_communicator] unknown backend");
}

#if !defined(MFSDP_WITH_CUDA) || !MFSDP_WITH_CUDA
std::unique_ptr<Communicator> make_cuda_staged_communicator(MPI_Comm, CommOptions, CudaCommOptions) {
  throw std::runtime_error(
      "[make_cuda_staged_communicator] MatrixFSDP was built without CUDA (MFSDP_WITH_CUDA=OFF); "
      "use make_mpi_communicator for CPU buffers");
}
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, CommOptions, CudaCommOptions) {
  throw std::runtime_error(
      "[make_nccl_communicator] MatrixFSDP was built without CUDA (MFSDP_WITH_CUDA=OFF); "
      "use make_mpi_communicator for CPU buffers");
}
#endif

}  // namespace mfsdp
