#!/usr/bin/env bash
# Prepares gpu-carry/ for a lent GPU machine whose image lacks this project's Debian packages (no
# network there): builds the CUDA tests and benchmark here (CUDA on, oneDNN off, so the only
# non-system libraries are small) and copies them with the shared libraries they need.
#   scripts/gpu_prepare.sh            # then: device run, carry ["gpu-carry"], command "bash scripts/gpu_check.sh"
# gpu_check.sh uses gpu-carry/ when it cannot build on the machine itself.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu-carry
CARRY=gpu-carry
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMFSDP_CUDA=ON -DMFSDP_DNNL=OFF >/dev/null
cmake --build "$BUILD" --target test_cuda_backend mfsdp-bench-cuda test_optim_cuda mfsdp-train -j"$(nproc)" >/dev/null
rm -rf "$CARRY"
mkdir -p "$CARRY/bin" "$CARRY/lib"
cp "$BUILD/tests/cuda/test_cuda_backend" "$BUILD/bin/mfsdp-bench-cuda" "$BUILD/tests/optim/test_optim_cuda" \
   "$BUILD/bin/mfsdp-train" "$CARRY/bin/"
# Libraries outside glibc/libstdc++ and the CUDA toolkit (which the GPU image has).
for exe in "$CARRY"/bin/*; do
  ldd "$exe" | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda' |
  while read -r lib; do cp -L "$lib" "$CARRY/lib/"; done
du -sh "$CARRY"
echo "gpu_prepare.sh: $CARRY/ ready (binaries: $(ls "$CARRY/bin" | tr '\n' ' '))"
