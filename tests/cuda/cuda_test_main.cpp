// Catch2 main for the CUDA backend tests: without a usable CUDA device (CPU-only build, no driver,
// no GPU) it prints why and exits with 77, which ctest reports as "skipped" (SKIP_RETURN_CODE 77).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "runtime/cuda/device_api.h"

int main(int argc, char** argv) {
  if (mfsdp::cuda::device_count() == 0) {
    std::printf("no CUDA device: skipping CUDA backend tests (built without CUDA, or the driver reports none)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
