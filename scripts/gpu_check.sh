#!/usr/bin/env bash
# GPU check for a lent GPU machine (e.g. one H200, ~15 minutes in all, possibly no network).
#
#   scripts/gpu_check.sh            # from anywhere; works in <repo>/build-gpu
#
# Steps (each timed; total target < 8 minutes):
#   1. dependencies: verified with `dpkg -s`; nothing is installed unless a package is missing AND the
#      network is reachable (a machine without network never runs apt-get);
#   2. configure Release with -DMFSDP_CUDA=ON into build-gpu (CUDA arch from nvidia-smi's compute_cap);
#   3. build the CUDA backend test + benchmark first and run `ctest -R '^cuda\.'`;
#   4. print the timing table of mfsdp-bench-cuda (GEMM GFLOP/s CUDA vs CPU, attention fwd/bwd ms,
#      Newton-Schulz 768x3072);
#   5. build everything else (bounded by GPU_CHECK_BUILD_BUDGET seconds) and run every other ctest
#      entry matching `cuda` and every entry labelled `gpu` (NCCL at world 1, cuda_staged at world 2
#      and 4 on one GPU, the engine's world-size equivalence on CUDA tensors, bf16 included);
#   6. scripts/gpu_train_check.sh: GPT-2 124M for 50 steps on the GPU at B = 16, T = 1024, bf16,
#      next to a 10-step CPU f32 run on the same data, and the table (tokens/s, MFU, ms per phase,
#      optimizer ms, peak memory, cudaMallocs after step 2, losses). GPU_CHECK_TRAIN=0 skips it.
# It only reads GPU state (nvidia-smi queries); it never changes clocks, persistence mode or resets.
# Logs go to $OUT/gpu_check when $OUT is set (device runner), else build-gpu/gpu_check.
# Environment: GPU_CHECK_BUILD_DIR (default <repo>/build-gpu), GPU_CHECK_BUILD_BUDGET (default 240 s), GPU_CHECK_JOBS (default nproc),
# GPU_CHECK_QUICK=1 (fewer benchmark repetitions). Exit status: 0 when every test run passed or skipped.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${GPU_CHECK_BUILD_DIR:-$ROOT/build-gpu}"
LOGS="${OUT:+$OUT/gpu_check}"
LOGS="${LOGS:-$BUILD/gpu_check}"
JOBS="${GPU_CHECK_JOBS:-$(nproc)}"
BUDGET="${GPU_CHECK_BUILD_BUDGET:-240}"
T0=$SECONDS
declare -a SUMMARY=()
FAILED=0
mkdir -p "$LOGS"

step() { echo; echo "=== [$((SECONDS - T0))s] $*"; }
note() { SUMMARY+=("$1"); }

# ---- 1. dependencies ----
step "dependencies"
PKGS=(cmake g++ make libopenmpi-dev openmpi-bin libeigen3-dev libspdlog-dev nlohmann-json3-dev libcli11-dev catch2)
MISSING=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || MISSING+=("$p"); done
if [ ${#MISSING[@]} -eq 0 ]; then
  echo "all packages present: ${PKGS[*]} (no apt-get)"
elif timeout 5 bash -c 'exec 3<>/dev/tcp/deb.debian.org/80' 2>/dev/null; then
  echo "missing: ${MISSING[*]}; network reachable: installing"
  if [ "$(id -u)" = 0 ]; then APT=(apt-get); else APT=(sudo apt-get); fi
  "${APT[@]}" update -qq && DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq "${MISSING[@]}" ||
    { echo "apt-get failed"; exit 2; }
elif [ -d "$ROOT/gpu-carry/bin" ]; then
  # No packages and no network: run the binaries prepared by scripts/gpu_prepare.sh instead.
  echo "missing packages: ${MISSING[*]}, no network: running the prebuilt binaries in gpu-carry/"
  export LD_LIBRARY_PATH="$ROOT/gpu-carry/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv
  for t in test_cuda_backend test_optim_cuda; do
    step "$t (prebuilt)"
    "$ROOT/gpu-carry/bin/$t" 2>&1 | tee "$LOGS/$t.log" | tail -25
    rc=${PIPESTATUS[0]}
    case $rc in 0) note "$t: passed" ;; 77) note "$t: skipped (no CUDA device)" ;; *) note "$t: FAILED rc=$rc"; FAILED=1 ;; esac
  done
  step "timings (prebuilt mfsdp-bench-cuda)"
  BENCH_ARGS=()
  [ "${GPU_CHECK_QUICK:-0}" = 1 ] && BENCH_ARGS=(--quick)
  timeout 180 "$ROOT/gpu-carry/bin/mfsdp-bench-cuda" "${BENCH_ARGS[@]}" 2>&1 | tee "$LOGS/bench_cuda.log"
  if [ "${GPU_CHECK_TRAIN:-1}" = 1 ]; then
    step "GPT-2 124M training (prebuilt mfsdp-train)"
    if bash "$ROOT/scripts/gpu_train_check.sh" "$ROOT/gpu-carry/bin" "$LOGS/train"; then note "train check: ok"
    else note "train check: FAILED (logs in $LOGS/train)"; FAILED=1; fi
  fi
  step "summary (total $((SECONDS - T0))s)"
  for s in "${SUMMARY[@]}"; do echo "  $s"; done
  exit $FAILED
else
  echo "missing packages: ${MISSING[*]} and no network: cannot build here (nothing installed)."
  echo "Run scripts/gpu_prepare.sh on the development machine and carry gpu-carry/."
  exit 2
fi
NVCC=/usr/local/cuda/bin/nvcc
[ -x "$NVCC" ] || NVCC="$(command -v nvcc || true)"
[ -n "$NVCC" ] || { echo "no nvcc found (/usr/local/cuda/bin/nvcc or PATH)"; exit 2; }
"$NVCC" --version | tail -1

# ---- GPU (read-only queries) ----
step "GPU"
ARCH="80;90"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv || true
  CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
  [[ "$CAP" =~ ^[0-9]+$ ]] && ARCH="$CAP"
else
  echo "nvidia-smi not found: the CUDA tests will report skipped"
fi
echo "CUDA architectures: $ARCH"

# ---- 2. configure ----
step "configure (Release, MFSDP_CUDA=ON) -> $BUILD"
if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMFSDP_CUDA=ON \
     "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" >"$LOGS/configure.log" 2>&1; then
  tail -30 "$LOGS/configure.log"
  echo "configure failed (log: $LOGS/configure.log)"
  exit 1
fi
tail -3 "$LOGS/configure.log"

# ---- 3. CUDA backend test ----
step "build test_cuda_backend mfsdp-bench-cuda (-j$JOBS)"
if cmake --build "$BUILD" --target test_cuda_backend mfsdp-bench-cuda -j"$JOBS" >"$LOGS/build_backend.log" 2>&1; then
  note "build backend test + bench: ok ($((SECONDS - T0))s)"
  step "ctest -R '^cuda\\.'"
  if (cd "$BUILD" && ctest -R '^cuda\.' --output-on-failure --timeout 300) 2>&1 | tee "$LOGS/ctest_cuda_backend.log"; then
    note "ctest ^cuda.: $(grep -E 'tests passed|tests failed' "$LOGS/ctest_cuda_backend.log" | tail -1)"
  else
    note "ctest ^cuda.: FAILED ($(grep -E 'tests passed|tests failed' "$LOGS/ctest_cuda_backend.log" | tail -1))"
    FAILED=1
  fi
  grep -q "Skipped" "$LOGS/ctest_cuda_backend.log" && note "  (skipped: no usable CUDA device)"

  # ---- 4. timings ----
  step "timings (mfsdp-bench-cuda)"
  BENCH_ARGS=()
  [ "${GPU_CHECK_QUICK:-0}" = 1 ] && BENCH_ARGS=(--quick)
  timeout 180 "$BUILD/bin/mfsdp-bench-cuda" "${BENCH_ARGS[@]}" 2>&1 | tee "$LOGS/bench_cuda.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) note "bench: ok (table in $LOGS/bench_cuda.log)" ;;
    77) note "bench: skipped (no CUDA device)" ;;
    *) note "bench: FAILED rc=$rc"; FAILED=1 ;;
  esac
else
  tail -40 "$LOGS/build_backend.log"
  note "build backend test + bench: FAILED (log: $LOGS/build_backend.log)"
  FAILED=1
fi

# ---- 5. everything else that touches the GPU ----
step "build all targets (budget ${BUDGET}s, -j$JOBS)"
if timeout "$BUDGET" cmake --build "$BUILD" -j"$JOBS" >"$LOGS/build_all.log" 2>&1; then
  note "build all: ok ($((SECONDS - T0))s)"
  step "ctest -R cuda -E '^cuda\\.'  and  ctest -L gpu -E cuda"
  for args in "-R cuda -E ^cuda\." "-L gpu -E cuda"; do
    name="ctest $args"
    # shellcheck disable=SC2086
    if (cd "$BUILD" && ctest $args --output-on-failure --timeout 300) 2>&1 | tee "$LOGS/ctest_more.log"; then
      if grep -q "No tests were found" "$LOGS/ctest_more.log"; then note "$name: no tests"
      else note "$name: $(grep -E 'tests passed|tests failed' "$LOGS/ctest_more.log" | tail -1)"; fi
    else
      note "$name: FAILED ($(grep -E 'tests passed|tests failed' "$LOGS/ctest_more.log" | tail -1))"
      FAILED=1
    fi
    cat "$LOGS/ctest_more.log" >>"$LOGS/ctest_other_gpu.log"
  done
else
  rc=$?
  tail -30 "$LOGS/build_all.log"
  if [ $rc = 124 ]; then note "build all: stopped after ${BUDGET}s budget (other GPU tests not run)"
  else note "build all: FAILED (log: $LOGS/build_all.log)"; FAILED=1; fi
fi

# ---- 6. training ----
if [ "${GPU_CHECK_TRAIN:-1}" = 1 ]; then
  step "GPT-2 124M training check"
  if cmake --build "$BUILD" --target mfsdp-train -j"$JOBS" >"$LOGS/build_train.log" 2>&1 &&
     bash "$ROOT/scripts/gpu_train_check.sh" "$BUILD/bin" "$LOGS/train" 2>&1 | tee "$LOGS/train_check.log"; then
    note "train check: ok (table in $LOGS/train_check.log)"
  else
    note "train check: FAILED (logs in $LOGS/train)"
    FAILED=1
  fi
fi

step "summary (total $((SECONDS - T0))s)"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
[ -f "$LOGS/bench_cuda.log" ] && { echo; cat "$LOGS/bench_cuda.log"; }
[ -f "$LOGS/train_check.log" ] && sed -n '/== GPU training check ==/,$p' "$LOGS/train_check.log"
exit $FAILED
