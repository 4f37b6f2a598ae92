// Built without CUDA (tests/comm/CMakeLists.txt picks this file or cuda_factories_refuse.cpp): the
// CUDA communicators and the device choice throw, naming the build.
#include <catch2/catch.hpp>

#include "comm/comm_factory.h"
#include "comm/mpi_backends.h"

using namespace mfsdp;

TEST_CASE("comm.mpi CUDA communicators refuse in a build without CUDA", "[comm]") {
  CHECK_THROWS_WITH(make_nccl_communicator(), Catch::Contains("built without CUDA"));
  CHECK_THROWS_WITH(make_cuda_staged_communicator(), Catch::Contains("built without CUDA"));
  CHECK_THROWS_WITH(select_device_for_process(), Catch::Contains("built without CUDA"));
  CHECK(selected_process_device().device < 0);
}
