#!/usr/bin/env bash
# Installs MatrixFSDP's Debian packages (idempotent: fast when already installed), then configures
# Release into build/ and builds what the main job (scripts/train.sh) and the README's commands
# need: every executable of apps/ (target mfsdp_apps), not the tests.
#   --tests     also the test packages (clang for the fuzzers, PyTorch and numpy for the fixtures,
#               matplotlib) and every target, the tests included: scripts/test.sh runs this
#   --plots     also matplotlib (scripts/plot.py; scripts/reproduce_paper.sh asks for it)
#   --no-torch  with --tests: without PyTorch and numpy (their tests skip)
#   --no-build  packages only
# CUDA is CMake's choice (MFSDP_CUDA in CMakeLists.txt: by default compiled only where a GPU is
# visible); MFSDP_CUDA=ON|OFF and MFSDP_NATIVE=ON|OFF from the environment are passed on, and
# CMake reads CUDAARCHS (e.g. "90") for the architectures. When CMake compiles CUDA without the
# cuDNN frontend headers, they are fetched (scripts/fetch_cudnn_frontend.sh, with pip) and CMake
# runs again. Builds use Ninja, and ccache when it is installed (CMakeLists.txt).
# Usage: scripts/setup.sh [--tests] [--plots] [--no-torch] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

tests=0
plots=0
want_torch=1
build=1
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    --plots) plots=1 ;;
    --no-torch) want_torch=0 ;;
    --no-build) build=0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

install_packages() {  # install_packages PACKAGE...: those not installed yet
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "setup.sh: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The product: compilers, CMake and Ninja, MPI and the libraries; catch2 (headers only) because CMake
# configures the tests too.
packages=(build-essential cmake ninja-build libopenmpi-dev openmpi-bin libeigen3-dev libdnnl-dev libspdlog-dev
          libcli11-dev nlohmann-json3-dev catch2 libxxhash-dev libpcre2-dev pkg-config python3)
# matplotlib draws the plots of scripts/plot.py (tests and scripts/reproduce_paper.sh only).
if [ "$plots" = 1 ] || [ "$tests" = 1 ]; then packages+=(python3-matplotlib); fi
if [ "$tests" = 1 ]; then
  # clang and its runtimes build the libFuzzer targets (tests/fuzz).
  packages+=(clang libclang-rt-dev)
  # A real Slurm for the slurm.* tests (scripts/emulate_cluster.sh up N --slurm): controller, node
  # daemon, clients, munge; its PMIx plugin loads libpmix from libpmix-dev.
  packages+=(slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge libpmix-dev)
  # PyTorch and numpy generate the test fixtures and check exported models; never used by the product.
  if [ "$want_torch" = 1 ]; then packages+=(python3-torch python3-numpy); fi
fi
install_packages "${packages[@]}"

[ "$build" = 1 ] || exit 0
cmake_args=(-DCMAKE_BUILD_TYPE=Release)
[ -f build/CMakeCache.txt ] || cmake_args+=(-G Ninja)  # an existing build/ keeps its generator
if [ -n "${MFSDP_CUDA:-}" ]; then cmake_args+=(-DMFSDP_CUDA="$MFSDP_CUDA"); fi
if [ -n "${MFSDP_NATIVE:-}" ]; then cmake_args+=(-DMFSDP_NATIVE="$MFSDP_NATIVE"); fi
configure() {
  cmake -S . -B build "${cmake_args[@]}" >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
}
configure
# CUDA compiled but the cuDNN attention off for want of its frontend headers: fetch them, configure again.
if grep -q "MatrixFSDP: cuDNN attention off" build-configure.log; then
  install_packages python3-pip
  if bash scripts/fetch_cudnn_frontend.sh; then
    configure
  else
    echo "setup.sh: warning: no cuDNN frontend headers; building without the cuDNN attention" >&2
  fi
fi
grep -E "MatrixFSDP:" build-configure.log || true
targets=(--target mfsdp_apps)
what="the executables"
if [ "$tests" = 1 ]; then targets=(); what="every target, the tests included"; fi
echo "setup.sh: building $what (log in build.log)"
if ! cmake --build build "${targets[@]}" -j"$(nproc)" >build.log 2>&1; then
  grep -E "error" -A3 build.log | head -60 || true
  tail -20 build.log
  exit 1
fi
echo "setup.sh: built into build/ (binaries in build/bin)"
