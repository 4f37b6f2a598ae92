#!/usr/bin/env bash
# Installs, builds and runs the whole test suite (ctest; MPI tests run under mpirun on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cd build
ctest --output-on-failure --timeout 900 "$@"
