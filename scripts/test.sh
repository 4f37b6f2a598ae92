#!/usr/bin/env bash
# Installs the test packages and builds every target, the tests included (scripts/setup.sh --tests),
# then runs the whole test suite (ctest; MPI tests run under mpirun on this machine),
# then the engine and end-to-end groups once more with oneDNN limited to AVX2 kernels, so both CPU
# code paths are checked for bitwise world-size equivalence on any x86-64 machine. The test-only Python
# environment .venv-test/ (scripts/test_venv.sh) is created first when PyPI is reachable. Before the
# suite, the GPU bundle is built (scripts/gpu_prepare.sh) and proved on CPU ranks
# (scripts/gpu_bundle_cpu_check.sh: its library closure, and its launcher running mfsdp-train at -np 2
# with the system's Open MPI hidden); MFSDP_SKIP_GPU_BUNDLE=1 leaves both out. Where a CUDA
# compiler is installed the tests compile the CUDA code (MFSDP_CUDA=ON, unless the environment
# sets MFSDP_CUDA), with or without a GPU: its tests skip without one.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MFSDP_CUDA:-}" ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  export MFSDP_CUDA=ON
fi
bash scripts/setup.sh --tests
# Test-only Python environment (tiktoken, transformers): cached; without PyPI the tests needing it skip.
bash scripts/test_venv.sh || echo "test.sh: continuing without .venv-test (data.tiktoken will be skipped)"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
if [ "${MFSDP_SKIP_GPU_BUNDLE:-0}" != 1 ]; then
  bash scripts/gpu_prepare.sh gpu-bundle
  bash scripts/gpu_bundle_cpu_check.sh gpu-bundle
fi
cd build
ctest --output-on-failure --timeout 900 "$@"
echo "test.sh: engine and end-to-end tests again with ONEDNN_MAX_CPU_ISA=AVX2"
ONEDNN_MAX_CPU_ISA=AVX2 ctest --output-on-failure --timeout 900 -R '^(engine|train)\.' "$@"
