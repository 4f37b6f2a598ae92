#!/usr/bin/env bash
# CPU-scale reproduction of the paper's comparison (a few minutes on 2 cores) and the cluster
# projection: calibrate this machine, mfsdp-bench at W=2 and W=4, predictions vs measurements,
# projections on the A100 / H100 cluster files with the paper's figures, the scaling trend on
# emulated nodes (scripts/bench_cluster.sh, where namespaces are permitted), plots, and
# results/REPORT.md. Also writes and syntax-checks the multi-node Slurm script.
#   scripts/reproduce_paper.sh [BUILD_DIR] [OUT_DIR]
# Sizes (environment): LAYERS=2 (GPT-2 124M widths, fewer layers), NS="5 2", SEQ=64, STEPS=1,
# WARMUP=1, PLACEMENTS="matrixfsdp fsdp2 zero1 ddp", WORLDS="2 4", TOLERANCE=5 (times),
# RATIO_TOLERANCE=2 (placement / matrixfsdp ratios), PYTHON=/usr/bin/python3 (with matplotlib), RUN_DIR (a training
# run directory to plot, optional), REUSE=1 (keep this_machine.json and bench_w*.json already in OUT_DIR),
# CLUSTER=1 (0 leaves out the emulated-cluster sweep, some 20 minutes on 2 cores).
# Without matplotlib for PYTHON, scripts/setup.sh --plots --no-build installs Debian's first.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
out="${2:-$root/results}"
LAYERS="${LAYERS:-2}" NS="${NS:-5 2}" SEQ="${SEQ:-64}" STEPS="${STEPS:-1}" WARMUP="${WARMUP:-1}"
PLACEMENTS="${PLACEMENTS:-matrixfsdp fsdp2 zero1 ddp}" WORLDS="${WORLDS:-2 4}" TOLERANCE="${TOLERANCE:-5}"
RATIO_TOLERANCE="${RATIO_TOLERANCE:-2}" PYTHON="${PYTHON:-/usr/bin/python3}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe)
bin="$build/bin"
for exe in mfsdp-bench mfsdp-project; do
  [ -x "$bin/$exe" ] || { echo "reproduce_paper.sh: $bin/$exe not built" >&2; exit 2; }
done
"$PYTHON" -c 'import matplotlib' 2>/dev/null || bash "$root/scripts/setup.sh" --plots --no-build
mkdir -p "$out"

reuse() { [ "${REUSE:-0}" = 1 ] && [ -s "$1" ]; }
if ! reuse "$out/this_machine.json"; then
  echo "== calibrating this machine (2 ranks)"
  "${mpirun[@]}" -np 2 "$bin/mfsdp-project" --calibrate "$out/this_machine.json" > "$out/calibrate.txt"
fi

benches=()
for w in $WORLDS; do
  benches+=("$out/bench_w$w.json")
  reuse "$out/bench_w$w.json" && continue
  echo "== mfsdp-bench at W=$w (GPT-2 124M widths, $LAYERS layers, T=$SEQ, NS $NS)"
  # shellcheck disable=SC2086
  "${mpirun[@]}" -np "$w" "$bin/mfsdp-bench" --layers "$LAYERS" --ns-steps $NS -T "$SEQ" --steps "$STEPS" \
    --warmup "$WARMUP" --placements $PLACEMENTS --json "$out/bench_w$w.json" | tee "$out/bench_w$w.txt"
done

echo "== predictions vs measurements"
status=0
: > "$out/compare.txt"
for b in "${benches[@]}"; do
  "$bin/mfsdp-project" --cluster "$out/this_machine.json" --compare "$b" --tolerance "$TOLERANCE" \
    --ratio-tolerance "$RATIO_TOLERANCE" \
    --json "${b%.json}_compare.json" >> "$out/compare.txt" || status=1
done
cat "$out/compare.txt"

echo "== cluster projections"
for c in a100_80gb_8x h100_80gb_8x; do
  "$bin/mfsdp-project" --cluster "$root/configs/clusters/$c.json" --model llama-7b -T 4096 --checkpointing \
    --paper --json "$out/projection_$c.json" > "$out/projection_$c.txt"
  "$bin/mfsdp-project" --cluster "$root/configs/clusters/$c.json" --model llama-13b -T 4096 --checkpointing \
    --replicate 2 --placements matrixfsdp fsdp2 zero1 --worlds 16 64 256 >> "$out/projection_$c.txt"
done
cat "$out/projection_a100_80gb_8x.txt"

echo "== emulated nodes (scripts/bench_cluster.sh; root with network namespaces and tc)"
cluster_rc=0
if [ "${CLUSTER:-1}" = 0 ]; then cluster_rc=skipped
elif reuse "$out/cluster/REPORT.md"; then :; else bash "$root/scripts/bench_cluster.sh" "$build" "$out/cluster" || cluster_rc=$?; fi
case $cluster_rc in
  0) ;;
  77) echo "namespaces or tc are not permitted here: no emulated-cluster measurement" ;;
  skipped) echo "left out (CLUSTER=0)" ;;
  *) echo "bench_cluster.sh failed (rc $cluster_rc)"; status=1 ;;
esac

echo "== plots"
plots=()
"$PYTHON" "$root/scripts/plot.py" bench "${benches[@]}" "$out"
plots+=("$out/bench_optimizer_ms.png")
"$PYTHON" "$root/scripts/plot.py" projection "$out/projection_a100_80gb_8x.json" "$out"
plots+=("$out/projection.png")
if [ -n "${RUN_DIR:-}" ]; then
  "$PYTHON" "$root/scripts/plot.py" run "$RUN_DIR" "$out"
  plots+=("$out/loss.png" "$out/throughput_phases.png")
fi
"$PYTHON" "$root/scripts/plot.py" check "${plots[@]}"

echo "== Slurm script for the multi-node run"
cat > "$out/matrixfsdp_bench.sbatch" <<'SBATCH'
#!/usr/bin/env bash
#SBATCH --job-name=matrixfsdp-bench
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --time=01:00:00
#SBATCH --exclusive
# Notice 300 s before the time limit: SIGUSR1 to every task of the job steps (the srun ranks), the
# trainer's checkpoint.notice_signal: each rank saves at the next step boundary and exits 75.
# 300 s covers a step, the save and Slurm's up-to-60 s early delivery.
#SBATCH --signal=USR1@300
# One rank per GPU; each rank selects GPU = local rank (comm/comm_factory.h). NCCL over InfiniBand.
set -euo pipefail
export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5}"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-^lo,docker}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-PHB}"
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-12}"
cd "${MFSDP_ROOT:-$PWD}"
# Training at world 64: 8 replicas of 8-GPU shard groups (HSDP, gathers stay in NVLink).
srun --mpi=pmix --cpu-bind=cores build/bin/mfsdp-train --config configs/gpt2_xl.json
# The same under mpirun, one rank per GPU. mpirun is not a job step's task, so ask for the notice
# on the batch shell instead (#SBATCH --signal=B:USR1@300) and pass it on: Open MPI's mpirun
# forwards SIGUSR1 to every rank without killing them (a SIGTERM is forwarded too, but the ranks
# are killed about 1 s later, before a step and a save can finish).
# mpirun -np $((SLURM_NNODES * 8)) --map-by ppr:8:node:PE=${SLURM_CPUS_PER_TASK:-12} --bind-to core \
#   -x NCCL_IB_HCA -x NCCL_SOCKET_IFNAME -x NCCL_DEBUG -x OMP_NUM_THREADS build/bin/mfsdp-train --config configs/gpt2_xl.json &
# launcher=$!; trap 'kill -USR1 "$launcher"' USR1; wait "$launcher" || wait "$launcher"
SBATCH
bash -n "$out/matrixfsdp_bench.sbatch" && grep -q "^#SBATCH --signal=USR1@" "$out/matrixfsdp_bench.sbatch" &&
  echo "matrixfsdp_bench.sbatch: syntax ok, asks for the notice signal"

{
  echo "# MatrixFSDP paper reproduction (CPU scale) and cluster projection"
  echo
  echo "Generated by scripts/reproduce_paper.sh on $(date -u +%Y-%m-%d). dtype f32 on CPU (the engine's only CPU"
  echo "dtype); Newton-Schulz steps: $NS; GPT-2 124M widths with $LAYERS layers, B=1, T=$SEQ per rank,"
  echo "$WARMUP warm-up + $STEPS measured steps per case, all ranks sharing $(nproc) cores."
  echo
  echo "## This machine (calibrated)"
  echo; echo '```'; cat "$out/this_machine.json"; echo '```'
  for b in "${benches[@]}"; do
    echo; echo "## mfsdp-bench $(basename "$b" .json)"; echo; echo '```'; cat "${b%.json}.txt"; echo '```'
  done
  echo; echo "## Predicted vs measured (factor = predicted / measured)"; echo; echo '```'; cat "$out/compare.txt"; echo '```'
  echo; echo "## Projection: A100 80 GB, 8 per node (bf16, NS in bf16)"; echo; echo '```'
  cat "$out/projection_a100_80gb_8x.txt"; echo '```'
  echo; echo "## Projection: H100 80 GB, 8 per node"; echo; echo '```'; cat "$out/projection_h100_80gb_8x.txt"; echo '```'
  echo; echo "## Plots"; echo
  for p in "${plots[@]}"; do echo "![$(basename "$p")]($(basename "$p"))"; done
  if [ -s "$out/cluster/REPORT.md" ]; then
    echo; sed -e 's/^# /## /' -e 's/^## Pred/### Pred/' -e 's|(ratio_vs_nodes.png)|(cluster/ratio_vs_nodes.png)|' \
      "$out/cluster/REPORT.md"
  fi
  echo; echo "## Multi-node"; echo
  echo "matrixfsdp_bench.sbatch (checked with bash -n): one rank per GPU, NCCL environment, srun or mpirun."
  echo "planner/README.md explains where the projection and the paper differ."
} > "$out/REPORT.md"
echo "wrote $out/REPORT.md"
exit $status
