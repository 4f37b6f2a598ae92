#!/usr/bin/env bash
# A fault soak under Slurm: one training job (scripts/train.sbatch, the tiny config at a fixed
# global batch) on emulated nodes (emulate_cluster.sh up NODES --slurm), with FAULTS faults at random
# times, each kind in turn from KINDS:
#   notice  scancel --signal=USR1: the ranks save and exit 75, the job requeues itself;
#   node    every process of a node of the job killed (slurmd too): the job requeues onto the nodes
#           left; the node's slurmd is started again once Slurm has marked it down
#           (emulate_cluster.sh revive), so it comes back;
#   link    a node's link down for LINK_DOWN_S seconds, then up again;
#   slurmd  a node's slurmd killed and started again 5 s later (its tasks run on: no job impact).
# At the end: the job has finished its steps, every checkpoint verifies (mfsdp-ckpt verify), the
# state fingerprint equals an uninterrupted run's at the same global batch, and one line per fault
# says its kind, when, how the job recovered, the seconds until it ran again and the steps redone,
# then the wall-time overhead over the uninterrupted run. Exit 0 when all holds, 1 otherwise, 77
# where namespaces are not permitted.
# Environment: NODES (2), SLOTS (2 ranks per node), STEPS (6000), FAULTS (4), KINDS ("notice slurmd
# link node"), SEED (1), LINK_DOWN_S (15), OUT (runs/slurm_soak: on a path every node sees).
# Usage: bash scripts/slurm_soak.sh      (as root, after bash scripts/setup.sh --tests)
set -uo pipefail
cd "$(dirname "$0")/.."
NODES=${NODES:-2} SLOTS=${SLOTS:-2} STEPS=${STEPS:-6000} FAULTS=${FAULTS:-4} SEED=${SEED:-1}
KINDS=${KINDS:-"notice slurmd link node"} LINK_DOWN_S=${LINK_DOWN_S:-15} OUT=${OUT:-runs/slurm_soak}
EMULATE=${EMULATE:-scripts/emulate_cluster.sh}
export MFSDP_EMULATE_DIR=/run/mfsdp-slurm-soak OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x build/bin/mfsdp-train ] || { echo "slurm_soak.sh: build first (bash scripts/setup.sh --tests)" >&2; exit 2; }
emu() { bash "$EMULATE" "$@"; }
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
rm -rf "$OUT/run" "$OUT/reference" "$OUT"/job-*.out
SETS=(--set training.global_batch_size=16 --set training.micro_batch_size=4 --set training.eval_interval=0
      --set training.sample_tokens=0 --set schedule.decay=constant --set logging.interval=10
      --set data.shuffle=true --set training.steps="$STEPS" --set checkpoint.interval=50
      --set sharding.collective_timeout_s=5)

emu up "$NODES" --slots "$SLOTS" --slurm || exit $?
trap 'emu down' EXIT

echo "== the uninterrupted run (mpirun, $((NODES * SLOTS)) ranks on this host)"
t0=$(date +%s.%N)
mpirun -np $((NODES * SLOTS)) --oversubscribe build/bin/mfsdp-train --config configs/tiny_test.json --threads 1 \
  "${SETS[@]}" --set logging.run_dir="$OUT/reference" --set checkpoint.interval=0 --set checkpoint.at_end=false \
  > "$OUT/reference.log" 2>&1 || { echo "the reference run failed: $OUT/reference.log"; exit 1; }
reference_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
want=$(grep -o '"state_fingerprint": "[0-9a-f]*"' "$OUT/reference/summary.json" | cut -d'"' -f4)

echo "== the job under Slurm, $FAULTS faults (seed $SEED)"
t_start=$(date +%s.%N)
job=$(CONFIG=configs/tiny_test.json emu slurm sbatch --parsable --output="$OUT/job-%j.out" scripts/train.sbatch \
      "${SETS[@]}" --set logging.run_dir="$OUT/run") || { echo "sbatch failed"; exit 1; }
log="$OUT/job-$job.out"
state() { emu slurm scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
restarts() { local n; n=$(grep -c '^mfsdp-train job .* (restart ' "$log" 2>/dev/null); echo "${n:-0}"; }
last_step() { grep -oE '^step +[0-9]+/' "$log" 2>/dev/null | tail -1 | grep -oE '[0-9]+' || echo 0; }
job_nodes() { emu slurm squeue -h -j "$job" -o '%N' | xargs -r bash -c 'scontrol show hostnames "$0"' 2>/dev/null; }
wait_until() {  # wait_until SECONDS CMD...: true once CMD succeeds
  local end=$(( $(date +%s) + $1 )); shift
  while (( $(date +%s) < end )); do "$@" && return 0; sleep 0.5; done
  return 1
}
running_past() { [ "$(state)" = RUNNING ] && (( $(last_step) > $1 )); }
# The job restarted (more than RUNS restarts) and resumed from a checkpoint.
recovered() {
  (( $(restarts) > $1 )) || return 1
  tail -n +"$(grep -n '(restart ' "$log" | tail -1 | cut -d: -f1)" "$log" | grep -q 'resumed at step'
}
node_down() { emu slurm sinfo -h -n "$1" -o '%t' | grep -qE '[*]|down'; }
finished() { case "$(state)" in COMPLETED|FAILED|CANCELLED|TIMEOUT) return 0;; esac; return 1; }

RANDOM=$SEED
read -r -a kinds <<< "$KINDS"
table=()
for (( f = 0; f < FAULTS; f++ )); do
  kind=${kinds[f % ${#kinds[@]}]}
  # mid-run: running, at least 50 steps (a checkpoint) past the last restart, then 1-4 s more
  runs=$(restarts)
  wait_until 300 running_past $(( $(last_step) + 50 )) || { echo "the job did not run on before fault $((f + 1))"; break; }
  sleep $(( 1 + RANDOM % 4 ))
  finished && break
  before=$(last_step)
  t_fault=$(date +%s.%N)
  victim=$(job_nodes | tail -1)  # the job's last node (the batch script runs on its first)
  case "$kind" in
    notice) emu slurm scancel --signal=USR1 "$job" ;;
    node)  # killed; started again once Slurm has marked it down, so that it comes back
      emu kill "${victim#node}"
      wait_until 120 node_down "$victim" || true
      emu revive "${victim#node}" ;;
    link) victim=node$((NODES - 1)); emu link "${victim#node}" down; sleep "$LINK_DOWN_S"; emu link "${victim#node}" up ;;
    slurmd) emu exec "${victim#node}" -- pkill -x slurmd; sleep 5; emu revive "${victim#node}" ;;
  esac
  if [ "$kind" != slurmd ] && ! wait_until 300 recovered "$runs"; then
    echo "fault $((f + 1)) ($kind): the job did not run again"
  fi
  wait_until 120 running_past "$before" || true
  again=$(awk -v a="$t_fault" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  resumed=$(grep -oE 'resumed at step [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || echo "$before")
  if (( $(restarts) > runs )); then
    how="requeued (restart $(restarts)), resumed at step $resumed on $(job_nodes | paste -sd, -)"
    redone=$(( before > resumed ? before - resumed : 0 ))
  else
    how="the job ran on"
    redone=0
  fi
  at=$(awk -v a="$t_start" -v b="$t_fault" 'BEGIN { printf "%.0f", b - a }')
  table+=("$(printf '%-7s %-6s at %4s s, step %5s: %s; running again after %s s; steps redone %s' \
             "$kind" "$victim" "$at" "$before" "$how" "$again" "$redone")")
done
wait_until 900 finished || echo "the job did not finish"
wall=$(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

echo "== faults"
printf '%s\n' "${table[@]}"
ok=1
[ "$(state)" = COMPLETED ] || { echo "the job ended $(state), not COMPLETED (see $log)"; ok=0; }
got=$(grep -o '"state_fingerprint": "[0-9a-f]*"' "$OUT/run/summary.json" 2>/dev/null | cut -d'"' -f4)
if [ -n "$got" ] && [ "$got" = "$want" ]; then
  echo "final state fingerprint $got = the uninterrupted run's"
else
  echo "final state fingerprint '$got' differs from the uninterrupted run's $want"; ok=0
fi
bad=0 n=0
for d in "$OUT"/run/checkpoints/step_*; do
  [ -d "$d" ] || continue
  n=$((n + 1))
  build/bin/mfsdp-ckpt verify "$d" > /dev/null 2>&1 || { echo "checkpoint $d does not verify"; bad=$((bad + 1)); }
done
echo "checkpoints: $n verified, $bad failed"
(( bad == 0 && n > 0 )) || ok=0
echo "wall time: $wall s under faults against $reference_s s uninterrupted (overhead $(awk -v a="$wall" -v b="$reference_s" 'BEGIN { printf "%.1f", a - b }') s)"
(( ok )) && echo "slurm_soak: passed" && exit 0
echo "slurm_soak: FAILED"
exit 1
