#!/usr/bin/env bash
# Computes the CPU f32 reference losses of the GPU training check and writes
# tests/fixtures/gpu_train_reference.json (committed; the GPU machine never recomputes them):
#
#   scripts/gpu_train_reference.sh [BIN_DIR]      # default build/bin; about an hour on 2 cores
#
# The run: GPT-2 124M (configs/gpt2_124m_shakespeare.json) on GPT-2-token Tiny Shakespeare,
# B = 16, T = 1024, one rank, 30 steps, f32 everywhere, activation recompute (bitwise equal to
# none; it keeps the CPU run under 9 GiB). The JSON records the overrides, which
# scripts/gpu_check.sh applies to its GPU runs as they are, so both runs read the same data.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$(cd "${1:-$ROOT/build/bin}" && pwd)"
OUT_JSON="$ROOT/tests/fixtures/gpu_train_reference.json"
CONFIG=configs/gpt2_124m_shakespeare.json
OVERRIDES=(training.micro_batch_size=16 model.seq_len=1024 training.grad_accum=1 training.steps=30
           training.eval_interval=0 training.sample_tokens=0 output.export= checkpoint.at_end=false
           logging.interval=1 data.val=)
RUN="$(mktemp -d)"
trap 'rm -rf "$RUN"' EXIT
sets=()
for o in "${OVERRIDES[@]}"; do sets+=(--set "$o"); done
cd "$ROOT"
"$BIN/mfsdp-train" --config "$CONFIG" "${sets[@]}" --set training.recompute=block \
  --set logging.run_dir="$RUN/run" --threads "$(nproc)" | tee "$RUN/train.log"
python3 - "$RUN/run/metrics.jsonl" "$OUT_JSON" "$CONFIG" "$(nproc)" "${OVERRIDES[@]}" <<'EOF'
import json, platform, subprocess, sys
metrics, out, config, threads, overrides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
losses = {m["step"]: m["loss"] for m in map(json.loads, open(metrics)) if m.get("type") == "train"}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
ref = {
    "about": "CPU f32 losses of the GPU training check (scripts/gpu_train_reference.sh)",
    "config": config,
    "overrides": overrides,
    "machine": f"{cpu}, {threads} threads, oneDNN f32",
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "losses": {str(k): losses[k] for k in sorted(losses)},
}
json.dump(ref, open(out, "w"), indent=1)
print(f"wrote {out}: {len(losses)} steps, loss {losses[min(losses)]:.4f} -> {losses[max(losses)]:.4f}")
EOF
