#!/usr/bin/env bash
# The paper's scaling trend on emulated nodes (scripts/emulate_cluster.sh): 4 ranks in all on 1, 2
# and 4 nodes with a fixed per-node link rate; per placement (matrixfsdp, fsdp2, zero1, and HSDP
# matrixfsdp with one replica per node) mfsdp-bench's phase times, the bytes that crossed node links
# (the nodes' interface counters), the optimizer-step and whole-step ratios over matrixfsdp; the
# link bandwidth measured with mfsdp-bench-comm; a cluster JSON of the emulated cluster and the
# projection's predictions beside the measurements. Root with namespaces and tc; exit 77 otherwise.
#   scripts/bench_cluster.sh [BUILD_DIR] [OUT_DIR]          (default build/, results/cluster/)
# Sizes (environment): LINK_RATE=50mbit, NODES="1 2 4", LAYERS=2 (GPT-2 124M widths), VOCAB=1024
# (a small vocabulary keeps the embedding from dominating the gathered bytes), NS="5" (the paper's
# runs use 5 Newton-Schulz steps), SEQ=64, WARMUP=1, STEPS=1, PLACEMENTS="matrixfsdp fsdp2 zero1",
# PYTHON=/usr/bin/python3 (with matplotlib for the plot).
# The emulated nodes share this machine's cores: every rank runs one thread, and the sizes are
# chosen so that link time dominates the baseline's step. The cluster has its own state directory
# (MFSDP_EMULATE_DIR, default /run/mfsdp-bench-cluster), so a cluster of the user's is left alone.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/results/cluster}"
LINK_RATE="${LINK_RATE:-50mbit}" NODES="${NODES:-1 2 4}" LAYERS="${LAYERS:-2}" VOCAB="${VOCAB:-1024}"
NS="${NS:-5}" SEQ="${SEQ:-64}" WARMUP="${WARMUP:-1}" STEPS="${STEPS:-1}"
PLACEMENTS="${PLACEMENTS:-matrixfsdp fsdp2 zero1}" PYTHON="${PYTHON:-/usr/bin/python3}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export MFSDP_EMULATE_DIR="${MFSDP_EMULATE_DIR:-/run/mfsdp-bench-cluster}"
emulate="$root/scripts/emulate_cluster.sh"
bin="$build/bin"
WORLD=4
for n in $NODES; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] && (( WORLD % n == 0 )) ||
    { echo "bench_cluster.sh: NODES='$NODES': '$n' is not a node count that divides the $WORLD ranks (1, 2 or 4)" >&2; exit 2; }
done
for exe in mfsdp-bench mfsdp-bench-comm mfsdp-project; do
  [ -x "$bin/$exe" ] || { echo "bench_cluster.sh: $bin/$exe not built" >&2; exit 2; }
done
mkdir -p "$out"

# Bytes sent by all nodes' links so far (each node's eth0; within-node traffic never reaches it).
link_bytes() {
  local n=$1 i total=0
  for (( i = 0; i < n; i++ )); do
    total=$(( total + $(bash "$emulate" exec "$i" -- cat /sys/class/net/eth0/statistics/tx_bytes) ))
  done
  echo "$total"
}

# One mfsdp-bench case on the cluster: TAG, then mfsdp-bench arguments.
bench_case() {
  local tag=$1 n=$2; shift 2
  local before after
  before=$(link_bytes "$n")
  # shellcheck disable=SC2086
  bash "$emulate" run -np "$WORLD" "$bin/mfsdp-bench" --threads 1 --layers "$LAYERS" --vocab "$VOCAB" \
    --ns-steps $NS -T "$SEQ" --warmup "$WARMUP" --steps "$STEPS" --json "$out/$tag.json" "$@" > "$out/$tag.txt"
  after=$(link_bytes "$n")
  echo "{\"tag\": \"$tag\", \"nodes\": $n, \"link_bytes\": $((after - before)), \"steps\": $((WARMUP + STEPS))}" \
    > "$out/$tag.link.json"
  grep headline "$out/$tag.txt" || true
}

for n in $NODES; do
  rc=0; bash "$emulate" up "$n" --slots $(( WORLD / n )) --link-rate "$LINK_RATE" || rc=$?
  (( rc == 77 )) && exit 77
  (( rc == 0 )) || exit "$rc"
  trap 'bash "$emulate" down' EXIT  # only a cluster this script brought up
  echo "== $n node(s) x $(( WORLD / n )) ranks, links $LINK_RATE"
  # The collectives' bus bandwidth over the whole layout (nccl-tests' busbw: what the projection's
  # link rates mean); each node's link carries its ranks' share.
  bash "$emulate" run -np "$WORLD" "$bin/mfsdp-bench-comm" --max-bytes 16M --iters 3 --warmup 1 > "$out/comm_n$n.txt"
  for p in $PLACEMENTS; do  # one job per placement: the link counters are then that placement's
    bench_case "bench_n${n}_$p" "$n" --placements "$p"
  done
  if (( n > 1 && n < WORLD )); then  # HSDP: one replica per node, the gathers stay inside a node
    for p in matrixfsdp fsdp2; do bench_case "bench_hsdp_n${n}_$p" "$n" --placements "$p" --replicate "$n"; done
  fi
done
bash "$emulate" down
trap - EXIT

echo "== calibration (one node's compute, the links' measured bandwidth)"
mpirun --oversubscribe -np 2 "$bin/mfsdp-project" --calibrate "$out/this_machine.json" > "$out/calibrate.txt"
"$PYTHON" "$root/scripts/cluster_report.py" "$out" "$bin/mfsdp-project" "$WORLD" "$LINK_RATE"
