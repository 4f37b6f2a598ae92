#!/usr/bin/env bash
# The training part of the GPU check (called by scripts/gpu_check.sh; runnable alone):
#
#   scripts/gpu_train_check.sh BIN_DIR LOG_DIR
#
# 1. starts the CPU reference in the background: GPT-2 124M, f32, 10 steps at B = 16, T = 1024 on
#    the bundled GPT-2-token Tiny Shakespeare (configs/gpt2_124m_shakespeare.json), on the CPU cores
#    the GPU run leaves free;
# 2. trains the same model on one GPU for GPU_TRAIN_STEPS (default 50) steps, same data and seed,
#    bf16 parameters and matmuls (runtime.device=cuda, NCCL at world 1);
# 3. prints one table (scripts/gpu_table.py): tokens/s, MFU, ms per phase, optimizer-step ms, peak
#    memory, raw cudaMallocs after step 2, the step telemetry, and the losses of steps 1-10 on GPU
#    (bf16) next to the CPU (f32) run, with the GPU loss at the last step.
# Exit status: 0 when the GPU run finished and the table was printed, 1 otherwise.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:?usage: gpu_train_check.sh BIN_DIR LOG_DIR}"
LOGS="${2:?usage: gpu_train_check.sh BIN_DIR LOG_DIR}"
STEPS="${GPU_TRAIN_STEPS:-50}"
CPU_STEPS="${GPU_TRAIN_CPU_STEPS:-10}"
CPU_BUDGET="${GPU_TRAIN_CPU_BUDGET:-240}"  # seconds the CPU reference may still take after the GPU run
mkdir -p "$LOGS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CONFIG="$ROOT/configs/gpt2_124m_shakespeare.json"
COMMON=(--set training.micro_batch_size=16 --set model.seq_len=1024 --set training.grad_accum=1
        --set training.eval_interval=0 --set training.sample_tokens=0 --set output.export=
        --set checkpoint.at_end=false --set logging.interval=1 --set data.val=)
CORES="$(nproc)"
CPU_THREADS=$(( CORES > 4 ? CORES - 2 : 1 ))

echo "CPU reference (f32, $CPU_STEPS steps, $CPU_THREADS threads) in the background"
rm -rf "$LOGS/cpu_f32" "$LOGS/gpu_bf16"
timeout $(( CPU_BUDGET + 600 )) "$BIN/mfsdp-train" --config "$CONFIG" "${COMMON[@]}" --threads "$CPU_THREADS" \
  --set training.steps="$CPU_STEPS" --set logging.run_dir="$LOGS/cpu_f32" >"$LOGS/train_cpu_f32.log" 2>&1 &
CPU_PID=$!

echo "GPU run (bf16, $STEPS steps)"
timeout 420 "$BIN/mfsdp-train" --config "$CONFIG" "${COMMON[@]}" --threads 2 \
  --set runtime.device=cuda --set precision.param_dtype=bf16 --set precision.reduce_dtype=f32 \
  --set training.steps="$STEPS" --set logging.run_dir="$LOGS/gpu_bf16" >"$LOGS/train_gpu_bf16.log" 2>&1
GPU_RC=$?
tail -4 "$LOGS/train_gpu_bf16.log"

# the CPU reference gets at most CPU_BUDGET more seconds
for _ in $(seq "$CPU_BUDGET"); do kill -0 "$CPU_PID" 2>/dev/null || break; sleep 1; done
kill "$CPU_PID" 2>/dev/null && echo "CPU reference stopped after the budget (partial losses)"
wait "$CPU_PID" 2>/dev/null

python3 "$ROOT/scripts/gpu_table.py" "$LOGS/gpu_bf16/metrics.jsonl" "$LOGS/cpu_f32/metrics.jsonl"
TABLE_RC=$?
[ "$GPU_RC" = 0 ] && [ "$TABLE_RC" = 0 ] && exit 0
echo "GPU training: rc=$GPU_RC (log: $LOGS/train_gpu_bf16.log), table rc=$TABLE_RC"
exit 1
