// Catch2 entry point for tests that run under mpirun: every rank runs the whole session.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>

#include "tests/mpi_test_skip.h"

namespace mfsdp::testing {
SkipCheck mpi_test_skip_check = nullptr;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (mfsdp::testing::mpi_test_skip_check) {
    if (const char* why = mfsdp::testing::mpi_test_skip_check()) {
      if (rank == 0) std::printf("skipping: %s\n", why);
      MPI_Finalize();
      return 77;
    }
  }
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  // Agree on the outcome so one failing rank fails the whole mpirun.
  int any_failed = rc != 0 ? 1 : 0, global_failed = 0;
  MPI_Allreduce(&any_failed, &global_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (global_failed && rank == 0) std::fprintf(stderr, "[mpi test] at least one rank failed\n");
  MPI_Finalize();
  return global_failed ? 1 : 0;
}
