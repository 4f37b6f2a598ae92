#!/usr/bin/env bash
# Builds the CPU code with AddressSanitizer and UndefinedBehaviorSanitizer into build-asan/ and
# runs the test suite there (CUDA off: the sanitizers instrument host code). OpenMPI's own
# allocations are not ours, so leak checking is off; any ASan/UBSan report fails the test that hit
# it. Usage: scripts/sanitize.sh [ctest arguments, e.g. -R engine]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests --no-build
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMFSDP_CUDA=OFF -DMFSDP_SANITIZE=address,undefined \
  >build-asan-configure.log 2>&1 || { cat build-asan-configure.log; exit 1; }
echo "sanitize.sh: building (log in build-asan.log)"
cmake --build build-asan -j"$(nproc)" >build-asan.log 2>&1 || { grep -E "error" -A3 build-asan.log | head -40; exit 1; }
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
cd build-asan
ctest --output-on-failure --timeout 1800 -E '^fuzz\.' "$@"
