#!/usr/bin/env bash
# The paper's capacity claim on one machine: a model that matrixfsdp trains at W ranks in a memory
# budget where zero1 and ddp cannot. By default GPT-2 medium widths (24 layers x 1024, 355M
# parameters, T=64, B=1) at W=4 inside a memory cgroup of 9 GiB (2.25 GiB per rank; matrixfsdp
# measures about 1.96 GiB per rank there, zero1 and ddp plan 3.66 and 4.47 GiB):
#   1. the capacity table of every family's presets at that budget (mfsdp-project --capacity);
#   2. zero1 and ddp: refused by the start-up memory plan (exit 2, with their figures);
#   3. matrixfsdp: trains STEPS steps; the loss per step and each rank's measured peak are printed;
#   4. zero1 forced past the check (sharding.memory_check=off): it really runs out inside the
#      cgroup (the kernel's OOM killer, exit 137) and nothing outside the cgroup is touched.
# Needs root for the cgroup (v1 memory controller or v2); without one it stops and says so.
# Environment: WORLD (4), BUDGET_GIB (9, for all ranks together), STEPS (3), LAYERS (24),
# WIDTH (1024), HEADS (16), OUT (runs/capacity_demo).
# Usage: bash scripts/capacity_demo.sh      (after bash scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
WORLD=${WORLD:-4} BUDGET_GIB=${BUDGET_GIB:-9} STEPS=${STEPS:-3}
LAYERS=${LAYERS:-24} WIDTH=${WIDTH:-1024} HEADS=${HEADS:-16} OUT=${OUT:-runs/capacity_demo}
BIN=build/bin
[ -x "$BIN/mfsdp-train" ] || { echo "capacity_demo.sh: build first (bash scripts/setup.sh)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"

# A memory cgroup of BUDGET_GIB for the runs (v1 or v2), removed on exit.
CG=""
if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
  CG=/sys/fs/cgroup/memory/mfsdp_capacity_demo_$$ LIMIT_FILE=memory.limit_in_bytes
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers && [ -w /sys/fs/cgroup ]; then
  CG=/sys/fs/cgroup/mfsdp_capacity_demo_$$ LIMIT_FILE=memory.max
else
  echo "capacity_demo.sh: no writable memory cgroup (run as root on a machine with the memory controller)" >&2
  exit 2
fi
mkdir "$CG"
cleanup() { [ -d "$CG" ] && { for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done; sleep 1; rmdir "$CG" 2>/dev/null || true; }; }
trap cleanup EXIT
echo $((BUDGET_GIB * 1024 * 1024 * 1024)) > "$CG/$LIMIT_FILE"
[ -f "$CG/memory.swappiness" ] && echo 0 > "$CG/memory.swappiness" 2>/dev/null || true
in_cgroup() { bash -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@"; }

model=(--set model.n_layer="$LAYERS" --set model.n_embd="$WIDTH" --set model.n_head="$HEADS" --set model.seq_len=64
       --set training.micro_batch_size=1 --set training.eval_interval=0 --set data.val=
       --set training.sample_tokens=0 --set output.export= --set checkpoint.at_end=false --set logging.interval=1)
train() {  # train PLACEMENT RUN_NAME [--set ...]: mfsdp-train at WORLD ranks in the cgroup; prints its exit code
  local placement=$1 name=$2; shift 2
  set +e
  in_cgroup mpirun -np "$WORLD" --oversubscribe "$BIN/mfsdp-train" --config configs/gpt2_124m_shakespeare.json \
    "${model[@]}" --set sharding.placement="$placement" --set training.steps="$STEPS" \
    --set logging.run_dir="$OUT/$name" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  set -e
  echo "$rc"
}

per_rank=$(awk -v b="$BUDGET_GIB" -v w="$WORLD" 'BEGIN { printf "%.3f", b * 1.073741824 / w }')
echo "== 1. capacity at ${per_rank} GB per rank (a CPU cluster calibrated on a 2-core machine: f32, its schedule, B=1 T=64)"
"$BIN/mfsdp-project" --cluster tests/bench/cpu_measurements/this_machine.json --capacity --memory-gb "$per_rank" \
  --dtype f32 --prefetch-depth 0 --overlap-reduce off -B 1 -T 64 --worlds "$WORLD"

echo "== 2. zero1 and ddp under the start-up memory plan (${BUDGET_GIB} GiB for ${WORLD} ranks)"
for p in zero1 ddp; do
  rc=$(train "$p" "$p")
  echo "$p: exit $rc"
  grep -m1 -o "the memory plan does not fit.*" "$OUT/$p.log" || tail -5 "$OUT/$p.log"
done

echo "== 3. matrixfsdp trains ${STEPS} steps"
rc=$(train matrixfsdp matrixfsdp)
grep -E "memory plan:|^step +[0-9]+/" "$OUT/matrixfsdp.log" | cut -d'|' -f1-2 || true
echo "matrixfsdp: exit $rc"
if [ "$rc" = 0 ]; then
  python3 - "$OUT/matrixfsdp/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
gib = 1 << 30
print(f"measured peak per rank (tracked tensors): {s['peak_bytes']['total'] / gib:.2f} GiB; "
      f"planned {s['memory_plan_bytes']['total'] / gib:.2f} GiB")
EOF
  grep -o "peak memory/rank [^|]*" "$OUT/matrixfsdp.log" || true
fi
echo "cgroup's peak usage for all ${WORLD} ranks: $(awk '{ printf "%.2f GiB", $1 / 1073741824 }' "$CG/memory.max_usage_in_bytes" 2>/dev/null || awk '{ printf "%.2f GiB", $1 / 1073741824 }' "$CG/memory.peak" 2>/dev/null || echo unknown)"

echo "== 4. zero1 forced past the check (sharding.memory_check=off), contained by the cgroup"
rc=$(train zero1 zero1_forced --set sharding.memory_check=off)
echo "zero1 forced: exit $rc ($( [ "$rc" = 137 ] && echo "killed by the OOM killer inside the cgroup" || echo "see $OUT/zero1_forced.log"))"
tail -3 "$OUT/zero1_forced.log"
