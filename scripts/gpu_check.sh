#!/usr/bin/env bash
# The GPU check: verifies the CUDA path on a GPU machine without this project's packages or network,
# in one run with a time limit of 6 minutes, from the bundle that scripts/gpu_prepare.sh built elsewhere.
#
#   scripts/gpu_check.sh [DIR]          # DIR: the bundle, default gpu-bundle/ (run from the repository)
#
# Steps, each under its own time budget (seconds; the argument for each is in scripts/README.md,
# "GPU check budgets"); a step over its budget fails:
#   1. closure of the bundle on this machine (ldd, and dlopen of the libraries cuDNN loads itself), and nvidia-smi;
#   2. the CUDA op table and backend tests, the CUDA optimizer tests, the rank-ordered reduction
#      kernel, the comm tests (NCCL at world 1; host-staged at world 2 and 4 on one GPU);
#   3. the engine on CUDA tensors (NCCL at world 1; host-staged at world 2 and 4) and its batch checks
#      (a token id outside the vocabulary stops with an error naming the batch);
#   4. compute-sanitizer --tool memcheck over the op table;
#   5. the CUDA benchmark table (mfsdp-bench-cuda --quick), GPT-2 124M's step time, tokens/s and MFU
#      (mfsdp-bench-model --device cuda, bf16, attention auto: cuDNN's; it prints the kernel), then
#      the one-GPU calibration of the
#      projection (mfsdp-project --calibrate --device cuda, three sizes) and a projection that loads
#      the cluster JSON it wrote ($LOGS/calibrated_gpu.json);
#   6. GPT-2 124M, B = 16, T = 1024, bf16, 30 steps with the fused attention (its timeline of steps
#      2-4 written, and how much of its gradient reductions overlap the backward read from it by
#      scripts/trace_overlap.py), then 30 unfused and 30 with cuDNN's attention side by side, against
#      the committed CPU f32 reference (DIR/gpu_train_reference.json), and beside them a Llama (RMSNorm,
#      RoPE, SwiGLU, grouped-query attention with heads of 64: cuDNN's) for 30 steps against its own
#      CPU f32 reference (DIR/gpu_train_reference_llama.json), and a Mixture-of-Experts model (router,
#      expert dispatch and combine on the GPU, f32) against DIR/gpu_train_reference_moe.json; each
#      run prints the attention kernel it ran;
#   7. one table of every step.
# Logs: $OUT/gpu_check when OUT is set, else gpu-check-logs/. Exit 0 only when a GPU is visible and
# every step ran and passed: a test that skips (exit 77) while nvidia-smi sees a GPU is a failure.
# Only reads GPU state (nvidia-smi queries); never changes clocks, modes or resets the device.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/gpu-bundle}"
[ -f "$DIR/env.sh" ] || { echo "gpu_check.sh: no bundle at $DIR (build it with scripts/gpu_prepare.sh)"; exit 2; }
DIR="$(cd "$DIR" && pwd)"
LOGS="${OUT:+$OUT/gpu_check}"
LOGS="${LOGS:-$ROOT/gpu-check-logs}"
mkdir -p "$LOGS"
# shellcheck disable=SC1091
source "$DIR/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=2
MPIRUN=(mpirun --bind-to none)
T0=$SECONDS
FAILED=0
GPU=0

# step NAME BUDGET KIND CMD...   runs CMD under `timeout BUDGET`, output in $LOGS/NAME.log, and writes
# its table row to $LOGS/NAME.row. KIND: catch (Catch2 tests: at least one test case must run, every
# rank must pass) or plain (exit status only). `run` runs one step; `start` starts one in the
# background, so steps run side by side until `wait`.
STEPS=()
step() {
  local name="$1" budget="$2" kind="$3"; shift 3
  local log="$LOGS/$name.log" t=$SECONDS status rc
  if [ "$GPU" = 0 ] && [ "$name" != closure ]; then
    echo "$name|not run: no GPU visible|0|$budget" >"$LOGS/$name.row"; return
  fi
  timeout -k 5 "$budget" bash -c '"$@"' "$name" "$@" >"$log" 2>&1  # bash -c: CMD may be a function
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then status="FAILED: over its budget"
  elif [ $rc = 77 ]; then status="FAILED: skipped while a GPU is visible"
  elif [ $rc != 0 ]; then status="FAILED: exit $rc"
  elif [ "$kind" = catch ] && ! sed 's/\x1b\[[0-9;]*m//g' "$log" |
       grep -qE "All tests passed \([0-9]+ assertions? in [1-9][0-9]* test cases?\)"; then
    status="FAILED: no test case ran"
  else status="passed"
  fi
  echo "$name|$status|$((SECONDS - t))|$budget" >"$LOGS/$name.row"
  echo "=== [$((SECONDS - T0))s] $name: $status ($((SECONDS - t)) s of ${budget} s)"
  [ "$status" = passed ] || tail -6 "$log" | sed 's/^/    /'
}
run() { STEPS+=("$1"); step "$@"; }
start() { STEPS+=("$1"); step "$@" & }

# Steps that are functions of this script: exported, as `step` runs them in a child bash.
export DIR LOGS ROOT
closure() {
  python3 "$DIR/bundle_closure.py" check "$DIR" --provided "$DIR/provided_libs.txt" || return 1
  local bad=0
  for f in "$DIR"/bin/*; do
    if ldd "$f" | grep -E "not found|version .* not found"; then bad=1; fi
  done
  echo "ldd: every bundled executable resolves on this machine (wheel libraries: ${MFSDP_WHEEL_LIBS:-none})"
  # loaded by cuDNN itself at run time, so ldd cannot see them: its graph and runtime-compiled
  # engines (the fused attention) and the NVRTC they compile with
  local lib
  for lib in libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9 libnvrtc.so.13; do
    if python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$lib" 2>/dev/null; then echo "dlopen: $lib loads"
    else echo "dlopen: $lib does not load (cuDNN attention would fail at its plan build)"; bad=1; fi
  done
  return $bad
}
export -f closure

# ---- 1. the GPU and the closure ----
if nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv >"$LOGS/nvidia-smi.log" 2>&1 &&
   [ "$(grep -c '^[0-9]' "$LOGS/nvidia-smi.log")" -gt 0 ]; then
  GPU=1
fi
cat "$LOGS/nvidia-smi.log"
run closure 20 plain closure

# ---- 2-4. tests side by side (18 processes on 16 cores, one GPU; none of them is timed) ----
SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo compute-sanitizer)"
start op_table 90 catch test_cuda_backend
start optim_cuda 90 catch test_optim_cuda
start reduce_kernel 90 catch test_comm_kernels
start comm_nccl_np1 90 catch "${MPIRUN[@]}" -np 1 -x MFSDP_TEST_BACKEND=nccl test_comm_cuda "[nccl]"
start comm_staged_np2 90 catch "${MPIRUN[@]}" -np 2 -x MFSDP_TEST_BACKEND=cuda_staged test_comm_cuda "[staged]"
start comm_staged_np4 90 catch "${MPIRUN[@]}" -np 4 -x MFSDP_TEST_BACKEND=cuda_staged test_comm_cuda "[staged]"
start engine_nccl_np1 90 catch "${MPIRUN[@]}" -np 1 -x MFSDP_TEST_BACKEND=nccl test_engine_mpi "~[equivalence]"
start engine_staged_np2 90 catch "${MPIRUN[@]}" -np 2 -x MFSDP_TEST_BACKEND=cuda_staged test_engine_mpi "~[equivalence]"
start engine_staged_np4 90 catch "${MPIRUN[@]}" -np 4 -x MFSDP_TEST_BACKEND=cuda_staged test_engine_mpi "~[equivalence]"
start engine_batches_nccl_np1 90 catch "${MPIRUN[@]}" -np 1 -x MFSDP_TEST_BACKEND=nccl test_engine_batches
start memcheck_op_table 90 catch "$SANITIZER" --tool memcheck --error-exitcode 3 test_cuda_backend "[table]"
wait

# ---- 5. benchmark table ----
run bench_cuda 45 plain mfsdp-bench-cuda --quick
run bench_model_cuda 30 plain mfsdp-bench-model --device cuda --dtype bf16 --attention auto -B 16 -T 1024 --warmup 2 --steps 5
run calibrate_gpu 20 plain bash -c 'mfsdp-project --calibrate "$LOGS/calibrated_gpu.json" --device cuda --cluster "$ROOT/configs/clusters/h100_80gb_8x.json" --calibrate-sizes 256 1024 4096 && mfsdp-project --cluster "$LOGS/calibrated_gpu.json" --worlds 8 --placements matrixfsdp fsdp2'

# ---- 6. GPT-2 124M and a Llama training against their CPU f32 references ----
export REF="$DIR/gpu_train_reference.json" REF_LLAMA="$DIR/gpu_train_reference_llama.json"
export REF_MOE="$DIR/gpu_train_reference_moe.json"
# train RUN REFERENCE ATTENTION [--set KEY=VALUE ...]: the reference's config and overrides, on the
# GPU in bf16 with the attention kernel ATTENTION, into $LOGS/RUN
train() {
  local run="$1" ref="$2" kernel="$3"; shift 3
  [ -f "$ref" ] || { echo "no reference losses at $ref (scripts/gpu_train_reference.sh makes them)"; return 2; }
  local config sets=()
  config="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config"])' "$ref")"
  while read -r o; do sets+=(--set "$o"); done < <(python3 -c \
    'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["overrides"]))' "$ref")
  rm -rf "$LOGS/$run"
  (cd "$ROOT" && mpirun --bind-to none -np 1 mfsdp-train --config "$config" "${sets[@]}" \
     --set runtime.device=cuda --set precision.param_dtype=bf16 --set runtime.attention="$kernel" \
     --set logging.run_dir="$LOGS/$run" --threads 2 "$@")
}
export -f train
# the run alone on the GPU also writes its timeline (steps 2-4): reductions against the backward
rm -f "$LOGS/trace_fused.json"  # the overlap step must read this run's timeline or none
run train_fused 60 plain train train_fused "$REF" fused --set logging.trace="$LOGS/trace_fused.json"
run trace_overlap 10 plain python3 "$ROOT/scripts/trace_overlap.py" "$LOGS/trace_fused.json" --require-overlap
sed 's/^/    /' "$LOGS/trace_overlap.log" 2>/dev/null
start train_unfused 60 plain train train_unfused "$REF" unfused  # side by side: the GPU has room for all three
start train_cudnn 60 plain train train_cudnn "$REF" cudnn
start train_llama 60 plain train train_llama "$REF_LLAMA" auto --set logging.peak_tflops=989  # d = 64: cuDNN's
start train_moe 60 plain train train_moe "$REF_MOE" auto --set precision.param_dtype=f32  # the MoE op is f32
wait
for k in fused unfused cudnn llama moe; do  # the kernel each run resolved (the trainer's start-up line)
  echo "train_$k: $(grep -o -m1 "attention: [a-z]*" "$LOGS/train_$k.log" 2>/dev/null || echo "attention: not reported")"
done
run train_vs_reference 10 plain python3 "$ROOT/scripts/gpu_table.py" "$REF" \
  fused="$LOGS/train_fused/metrics.jsonl" unfused="$LOGS/train_unfused/metrics.jsonl" \
  cudnn="$LOGS/train_cudnn/metrics.jsonl"
# the Llama and MoE tables in one step (two Python start-ups, well inside its budget)
run llama_moe_vs_reference 10 plain bash -c 'python3 "$ROOT/scripts/gpu_table.py" "$REF_LLAMA" \
  llama="$LOGS/train_llama/metrics.jsonl"; a=$?; python3 "$ROOT/scripts/gpu_table.py" "$REF_MOE" \
  moe="$LOGS/train_moe/metrics.jsonl" && exit $a'


# ---- 7. the table ----
echo
GPU_NAME="no GPU visible"
[ "$GPU" = 1 ] && GPU_NAME="$(sed -n 2p "$LOGS/nvidia-smi.log")"
echo "== GPU check ($GPU_NAME) =="
printf "  %-24s %-44s %8s %8s\n" step result seconds budget
for name in "${STEPS[@]}"; do
  IFS='|' read -r name status took budget <"$LOGS/$name.row" || status="FAILED: no result"
  [ "$status" = passed ] || FAILED=1
  printf "  %-24s %-44s %8s %8s\n" "$name" "$status" "$took" "$budget"
done
echo "  total: $((SECONDS - T0)) s of 360 s; logs in $LOGS"
[ -f "$LOGS/bench_cuda.log" ] && { echo; cat "$LOGS/bench_cuda.log"; }
[ -f "$LOGS/bench_model_cuda.log" ] && grep -m1 "attention" "$LOGS/bench_model_cuda.log"
[ -f "$LOGS/train_vs_reference.log" ] && cat "$LOGS/train_vs_reference.log"
[ -f "$LOGS/llama_moe_vs_reference.log" ] && cat "$LOGS/llama_moe_vs_reference.log"
[ $((SECONDS - T0)) -le 360 ] || { echo "gpu_check.sh: over the check's 6-minute time limit"; FAILED=1; }
[ "$GPU" = 1 ] || echo "gpu_check.sh: nvidia-smi sees no GPU: nothing was verified"
exit $FAILED
