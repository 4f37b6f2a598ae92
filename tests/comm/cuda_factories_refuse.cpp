// Built with CUDA (tests/comm/CMakeLists.txt picks this file or cuda_factories_refuse_stub.cpp):
// the CUDA communicators never pick a device, so without select_device_for_process() they refuse.
#include <catch2/catch.hpp>

#include "comm/comm_factory.h"
#include "comm/mpi_backends.h"

using namespace mfsdp;

TEST_CASE("comm.mpi CUDA communicators refuse before a device is selected", "[comm]") {
  REQUIRE(selected_process_device().device < 0);  // this executable never selects one
  CHECK_THROWS_WITH(make_cuda_staged_communicator(), Catch::Contains("select_device_for_process"));
  CHECK_THROWS_WITH(make_nccl_communicator(), Catch::Contains("select_device_for_process"));
}
