#!/usr/bin/env bash
# Installs MatrixFSDP's Debian packages (idempotent: fast when already installed), then configures
# and builds Release into build/. CUDA sources are compiled when nvcc is found under /usr/local/cuda
# (override with MFSDP_CUDA=ON|OFF); then the cuDNN frontend headers are fetched first
# (scripts/fetch_cudnn_frontend.sh). Usage: scripts/setup.sh [--no-torch] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

want_torch=1
build=1
for arg in "$@"; do
  case "$arg" in
    --no-torch) want_torch=0 ;;
    --no-build) build=0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

packages=(build-essential cmake libopenmpi-dev openmpi-bin libeigen3-dev libdnnl-dev libspdlog-dev libcli11-dev
          nlohmann-json3-dev catch2 libxxhash-dev libpcre2-dev pkg-config clang libclang-rt-dev python3)
# matplotlib draws the plots of scripts/plot.py (tests and scripts/reproduce_paper.sh only); pip
# fetches the cuDNN frontend's headers (scripts/fetch_cudnn_frontend.sh).
packages+=(python3-matplotlib python3-pip)
# PyTorch and numpy generate the test fixtures and check exported models; never used by the product.
[ "$want_torch" = 1 ] && packages+=(python3-torch python3-numpy)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup.sh: Debian packages already installed"
fi

[ "$build" = 1 ] || exit 0
# the cuDNN attention's frontend headers (.deps/), when CUDA will be compiled
if [ "${MFSDP_CUDA:-AUTO}" != OFF ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  bash scripts/fetch_cudnn_frontend.sh ||
    echo "setup.sh: warning: no cuDNN frontend headers; building without the cuDNN attention" >&2
fi
cuda_flag=()
[ -n "${MFSDP_CUDA:-}" ] && cuda_flag=(-DMFSDP_CUDA="$MFSDP_CUDA")
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${cuda_flag[@]}" >build-configure.log 2>&1 || {
  cat build-configure.log; exit 1; }
grep -E "MatrixFSDP:" build-configure.log || true
echo "setup.sh: building (log in build.log)"
if ! cmake --build build -j"$(nproc)" >build.log 2>&1; then
  grep -E "error" -A3 build.log | head -60 || true
  tail -20 build.log
  exit 1
fi
echo "setup.sh: built into build/ (binaries in build/bin)"
