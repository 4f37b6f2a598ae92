#!/usr/bin/env bash
# Computes the CPU f32 reference losses of a GPU training check and writes them under
# tests/fixtures/ (committed; the GPU machine never recomputes them):
#
#   scripts/gpu_train_reference.sh [gpt2|llama|moe] [BIN_DIR]      # default gpt2 and build/bin
#
# gpt2 (tests/fixtures/gpu_train_reference.json, about an hour on 2 cores): GPT-2 124M
# (configs/gpt2_124m_shakespeare.json) on GPT-2-token Tiny Shakespeare, B = 16, T = 1024, one rank,
# 30 steps, f32 everywhere, activation recompute (bitwise equal to none; it keeps the CPU run under
# 9 GiB). llama (tests/fixtures/gpu_train_reference_llama.json, under a minute): the character
# Llama (configs/llama_shakespeare_char.json) widened to 256 with 4 heads of 64 (the cuDNN
# attention's head size) and 2 key/value heads, T = 256, B = 16, one rank, 30 steps, f32. moe
# (tests/fixtures/gpu_train_reference_moe.json, seconds): the character Mixture-of-Experts model
# (configs/moe_shakespeare_char.json: 8 experts, top 2) at T = 128, B = 16, one rank, 30 steps,
# f32 (the MoE op's only precision: its GPU run overrides the check's bf16 parameters). The JSON
# records the overrides, which scripts/gpu_check.sh applies to its GPU runs as they are, so both
# runs read the same data.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODEL="${1:-gpt2}"
BIN="$(cd "${2:-$ROOT/build/bin}" && pwd)"
COMMON=(training.grad_accum=1 training.steps=30 training.eval_interval=0 training.sample_tokens=0 output.export=
        checkpoint.at_end=false logging.interval=1 data.val=)
case "$MODEL" in
  gpt2)
    OUT_JSON="$ROOT/tests/fixtures/gpu_train_reference.json"
    CONFIG=configs/gpt2_124m_shakespeare.json
    OVERRIDES=(training.micro_batch_size=16 model.seq_len=1024 "${COMMON[@]}")
    CPU_ONLY=(training.recompute=block) ;;
  llama)
    OUT_JSON="$ROOT/tests/fixtures/gpu_train_reference_llama.json"
    CONFIG=configs/llama_shakespeare_char.json
    OVERRIDES=(model.n_embd=256 model.intermediate_size=768 model.seq_len=256 training.micro_batch_size=16
               "${COMMON[@]}")
    CPU_ONLY=() ;;
  moe)
    OUT_JSON="$ROOT/tests/fixtures/gpu_train_reference_moe.json"
    CONFIG=configs/moe_shakespeare_char.json
    OVERRIDES=(model.seq_len=128 training.micro_batch_size=16 "${COMMON[@]}")
    CPU_ONLY=() ;;
  *) echo "gpu_train_reference.sh: model must be gpt2, llama or moe, not '$MODEL'"; exit 2 ;;
esac
RUN="$(mktemp -d)"
trap 'rm -rf "$RUN"' EXIT
sets=()
for o in "${OVERRIDES[@]}"; do sets+=(--set "$o"); done
cd "$ROOT"
for o in "${CPU_ONLY[@]}"; do sets+=(--set "$o"); done  # bitwise neutral: not recorded
"$BIN/mfsdp-train" --config "$CONFIG" "${sets[@]}" --set logging.run_dir="$RUN/run" --threads "$(nproc)" |
  tee "$RUN/train.log"
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
