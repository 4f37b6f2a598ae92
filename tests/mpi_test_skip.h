// A test binary run under mpirun may ask the MPI Catch2 main to skip the whole session (exit 77,
// which ctest reports as skipped): set mpi_test_skip_check, from a static initializer, to a
// function that returns why to skip, or nullptr to run.
#pragma once

namespace mfsdp::testing {
using SkipCheck = const char* (*)();
/// Called by tests/catch_mpi_main.cpp after MPI_Init on every rank (when set).
extern SkipCheck mpi_test_skip_check;
}  // namespace mfsdp::testing
