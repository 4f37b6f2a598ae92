// The communicators of the engine tests: MFSDP_TEST_BACKEND=mpi (default) | cuda_staged | nccl
// picks the backend, and so the device of every engine buffer. Include once per test executable
// (it registers the session's skip check: exit 77 when CUDA is asked for and no device is visible).
#pragma once
#include <cstdlib>
#include <memory>

#include "comm/mpi_backends.h"
#include "runtime/cuda/device_api.h"
#include "tests/mpi_test_skip.h"

namespace mfsdp::testing {

inline CommBackend test_backend() {
  const char* b = std::getenv("MFSDP_TEST_BACKEND");
  return b && *b ? parse_comm_backend(b) : CommBackend::mpi;
}

[[maybe_unused]] inline const bool kEngineSkipRegistered = [] {
  mpi_test_skip_check = []() -> const char* {
    if (test_backend() == CommBackend::mpi || cuda::device_count() > 0) return nullptr;
    return "MFSDP_TEST_BACKEND asks for CUDA tensors and no CUDA device is visible";
  };
  return true;
}();

/// A communicator of the test backend over `comm`. The CUDA backends use the device the process
/// selected from its world node-local rank (the first call is collective over the world: every
/// rank makes its communicators in the same order).
inline std::unique_ptr<Communicator> make_test_communicator(MPI_Comm comm) {
  if (test_backend() != CommBackend::mpi) select_device_for_process();
  return make_communicator_over(test_backend(), comm);
}

/// The test backend over all ranks (made once).
inline Communicator& world() {
  static std::unique_ptr<Communicator> c = make_test_communicator(MPI_COMM_WORLD);
  return *c;
}
/// Each rank's private world of size 1 (the reference runs; made once).
inline Communicator& self() {
  static std::unique_ptr<Communicator> c = make_test_communicator(MPI_COMM_SELF);
  return *c;
}

}  // namespace mfsdp::testing
