#include "comm/comm_factory.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
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

std::unique_ptr<Communicator> make_host_communicator(CommOptions opts) {
  return make_mpi_communicator(MPI_COMM_WORLD, opts);
}

void abort_job(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // not reached: MPI_Abort ends the process
}

std::unique_ptr<Communicator> make_communicator(CommBackend b, CommOptions opts, CudaCommOptions cuda) {
  if (b != CommBackend::mpi) select_device_for_process();
  switch (b) {
    case CommBackend::mpi: return make_mpi_communicator(MPI_COMM_WORLD, opts);
    case CommBackend::cuda_staged: return make_cuda_staged_communicator(MPI_COMM_WORLD, opts, cuda);
    case CommBackend::nccl: return make_nccl_communicator(MPI_COMM_WORLD, opts, cuda);
  }
  throw std::invalid_argument("[make_communicator] unknown backend");
}

std::unique_ptr<Communicator> make_split_communicator(CommBackend b, int color, int key, CommOptions opts,
                                                      CudaCommOptions cuda) {
  if (color < 0) throw std::invalid_argument("[make_split_communicator] color must be >= 0, got " + std::to_string(color));
  if (b != CommBackend::mpi) select_device_for_process();  // collective over the world, before the split
  MPI_Comm sub = MPI_COMM_NULL;
  if (MPI_Comm_split(MPI_COMM_WORLD, color, key, &sub) != MPI_SUCCESS)
    throw std::runtime_error("[make_split_communicator] MPI_Comm_split failed");
  std::unique_ptr<Communicator> out;
  try {
    switch (b) {  // every backend duplicates `sub`, so it is freed here
      case CommBackend::mpi: out = make_mpi_communicator(sub, opts); break;
      case CommBackend::cuda_staged: out = make_cuda_staged_communicator(sub, opts, cuda); break;
      case CommBackend::nccl: out = make_nccl_communicator(sub, opts, cuda); break;
    }
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  MPI_Comm_free(&sub);
  if (!out) throw std::invalid_argument("[make_split_communicator] unknown backend");
  return out;
}

HsdpGroups make_hsdp_groups(CommBackend b, int replicas, CommOptions opts, CudaCommOptions cuda) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (replicas < 1 || world % replicas != 0)
    throw std::invalid_argument("[make_hsdp_groups] replicas = " + std::to_string(replicas) +
                                " must be >= 1 and divide the world size " + std::to_string(world));
  const int S = world / replicas;
  HsdpGroups g;
  g.replicas = replicas;
  g.shard = make_split_communicator(b, rank / S, rank % S, opts, cuda);
  g.replica = make_split_communicator(b, rank % S, rank / S, opts, cuda);
  return g;
}

}  // namespace mfsdp
