#!/usr/bin/env bash
# Builds the GPU bundle: everything a GPU machine without this project's packages or network needs to
# run the GPU check (scripts/gpu_check.sh), at most 64 MiB together with the repository's files.
#
#   scripts/gpu_prepare.sh [DIR]        # default gpu-bundle/; build tree in build-gpu-bundle/
#
# DIR holds:
#   bin/        the CUDA test executables, mfsdp-bench-cuda, mfsdp-project and mfsdp-train: portable x86-64 code
#               (no -march=native), SASS for sm_80 and sm_90 (+ sm_90 PTX), no RPATH, stripped;
#               their cuDNN attention is lib/libmfsdp_cudnn_attention.so (one copy of the cuDNN
#               frontend's code for all of them; the frontend's headers come from
#               scripts/fetch_cudnn_frontend.sh, run first);
#   lib/        every shared library they and the MPI runtime load that the GPU machine does not
#               provide (scripts/gpu_provided_libs.txt: glibc, libstdc++, libgcc_s, the driver's
#               libcuda, the CUDA libraries of its Python nvidia-* wheels);
#   mpi/        Debian's Open MPI runtime relocated (OPAL_PREFIX): orterun (= mpirun), orted, the
#               openmpi3 plugins that need no network stack the bundle leaves out, the help
#               files; PMIx's plugins and help files under mpi/pmix (PMIX_PREFIX);
#   env.sh      to source: the variables above, the launcher and binaries first on PATH, the bundle's
#               lib/ then the wheels' lib folders (found by asking python3) on LD_LIBRARY_PATH;
#   bundle_closure.py, provided_libs.txt, gpu_train_reference*.json: the closure check and the
#               committed CPU f32 reference losses of the training check.
# The closure is checked before the script ends (exit 1 when open or over the size limit).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-gpu-bundle}"
BUILD="${GPU_BUNDLE_BUILD_DIR:-build-gpu-bundle}"
LIMIT_MIB=64
TARGETS=(test_cuda_backend test_optim_cuda test_comm_kernels test_comm_cuda test_engine_mpi test_engine_batches
         mfsdp-bench-cuda mfsdp-bench-model mfsdp-project mfsdp-train)
# Network stacks Debian's Open MPI can load but a single machine does not need; plugins needing them go.
REFUSE='^lib(ibverbs|rdmacm|ucp|ucs|uct|ucm|fabric|psm|psm2|jvm|java|gfortran|nl-|efa|mlx)'

t0=$SECONDS
bash scripts/fetch_cudnn_frontend.sh
echo "gpu_prepare.sh: configuring $BUILD (Release, CUDA sm_80 + sm_90, portable x86-64, no oneDNN)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMFSDP_CUDA=ON -DMFSDP_DNNL=OFF -DMFSDP_NATIVE=OFF \
      "-DCMAKE_CUDA_ARCHITECTURES=80-real;90" -DCMAKE_SKIP_RPATH=ON >"$BUILD.configure.log" 2>&1 ||
  { tail -30 "$BUILD.configure.log"; exit 1; }
echo "gpu_prepare.sh: building ${TARGETS[*]} (log: $BUILD.log)"
cmake --build "$BUILD" --target "${TARGETS[@]}" -j"$(nproc)" >"$BUILD.log" 2>&1 ||
  { grep -E "error" -A3 "$BUILD.log" | head -40; tail -15 "$BUILD.log"; exit 1; }
grep -q "MatrixFSDP: cuDNN attention on" "$BUILD.configure.log" ||
  { grep "MatrixFSDP: cuDNN" "$BUILD.configure.log"; echo "gpu_prepare.sh: the bundle needs cuDNN attention"; exit 1; }
echo "gpu_prepare.sh: built in $((SECONDS - t0)) s"

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
for t in "${TARGETS[@]}"; do
  exe="$(find "$BUILD" -type f -name "$t" -perm -u+x | head -1)"
  [ -n "$exe" ] || { echo "gpu_prepare.sh: $t not found in $BUILD"; exit 1; }
  cp "$exe" "$DIR/bin/"
done
strip --strip-unneeded "$DIR"/bin/*
cudnn_so="$(find "$BUILD" -type f -name libmfsdp_cudnn_attention.so | head -1)"
[ -n "$cudnn_so" ] || { echo "gpu_prepare.sh: libmfsdp_cudnn_attention.so not found in $BUILD"; exit 1; }
cp "$cudnn_so" "$DIR/lib/"
strip --strip-unneeded "$DIR/lib/libmfsdp_cudnn_attention.so"

# ---- Open MPI, relocated: Debian's layout under the new prefix ----
mpi_lib="$(dirname "$(readlink -f "$(ldconfig -p | awk '/libmpi\.so\.40 .*x86-64/ {print $NF; exit}')")")"
ompi_pkg="$mpi_lib/openmpi/lib/openmpi3"
pmix_pkg="$mpi_lib/pmix2"
[ -d "$ompi_pkg" ] || { echo "gpu_prepare.sh: Open MPI plugins not found at $ompi_pkg (openmpi-bin)"; exit 1; }
rel="${mpi_lib#/usr/}"  # lib/x86_64-linux-gnu
mkdir -p "$DIR/mpi/bin" "$DIR/mpi/$rel/openmpi/lib" "$DIR/mpi/share" "$DIR/mpi/pmix/lib"
cp /usr/bin/orterun /usr/bin/orted "$DIR/mpi/bin/"
cp /usr/bin/orterun "$DIR/mpi/bin/mpirun"  # a copy, not a link: links do not survive every transfer
cp -rL "$ompi_pkg" "$DIR/mpi/$rel/openmpi/lib/"
cp -rL /usr/share/openmpi "$DIR/mpi/share/"
if [ -d "$pmix_pkg/lib/pmix" ]; then
  cp -rL "$pmix_pkg/lib/pmix" "$DIR/mpi/pmix/lib/"
  cp -rL "$pmix_pkg/share" "$DIR/mpi/pmix/"
fi

cp scripts/gpu_provided_libs.txt "$DIR/provided_libs.txt"
cp scripts/bundle_closure.py "$DIR/"
for ref in gpu_train_reference.json gpu_train_reference_llama.json gpu_train_reference_moe.json; do
  cp "tests/fixtures/$ref" "$DIR/" 2>/dev/null ||
    echo "gpu_prepare.sh: note: tests/fixtures/$ref missing (its training check has no reference)"
done
python3 scripts/bundle_closure.py fill "$DIR" --provided "$DIR/provided_libs.txt" --refuse "$REFUSE"

cat >"$DIR/env.sh" <<'EOF'
# Source this file (bash): the GPU bundle's launcher and binaries first on PATH, its libraries and
# then the CUDA libraries of this machine's Python nvidia-* wheels on LD_LIBRARY_PATH, and the
# relocated Open MPI (OPAL_PREFIX) and PMIx (PMIX_PREFIX). MFSDP_PYTHON names another interpreter.
MFSDP_BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export MFSDP_BUNDLE
export OPAL_PREFIX="$MFSDP_BUNDLE/mpi" PMIX_PREFIX="$MFSDP_BUNDLE/mpi/pmix"
MFSDP_WHEEL_LIBS="$("${MFSDP_PYTHON:-python3}" - <<'PY' 2>/dev/null || true
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
dirs = {os.path.dirname(p) for d in nvidia.__path__
        for p in glob.glob(os.path.join(d, "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(dirs)))
PY
)"
export MFSDP_WHEEL_LIBS
export LD_LIBRARY_PATH="$MFSDP_BUNDLE/lib${MFSDP_WHEEL_LIBS:+:$MFSDP_WHEEL_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$MFSDP_BUNDLE/bin:$MFSDP_BUNDLE/mpi/bin:$PATH"
# Open MPI's default launcher wants ssh or rsh even on one machine; without either, launch locally.
if ! command -v ssh >/dev/null 2>&1 && ! command -v rsh >/dev/null 2>&1; then
  export OMPI_MCA_plm=isolated
fi
EOF

python3 "$DIR/bundle_closure.py" check "$DIR" --provided "$DIR/provided_libs.txt"
bundle_kib=$(du -sk "$DIR" | cut -f1)
tree_kib=$(git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "gpu_prepare.sh: $DIR is $((bundle_kib / 1024)) MiB; with the repository's files $(((bundle_kib + tree_kib) / 1024)) MiB (limit $LIMIT_MIB MiB)"
if [ $((bundle_kib + tree_kib)) -gt $((LIMIT_MIB * 1024)) ]; then
  echo "gpu_prepare.sh: over the $LIMIT_MIB MiB limit"
  exit 1
fi
echo "gpu_prepare.sh: $DIR ready ($((SECONDS - t0)) s). On the GPU machine: bash scripts/gpu_check.sh $DIR"
