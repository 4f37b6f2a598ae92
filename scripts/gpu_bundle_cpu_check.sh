#!/usr/bin/env bash
# CPU-side proof of the GPU bundle (scripts/gpu_prepare.sh), run by scripts/test.sh:
#
#   scripts/gpu_bundle_cpu_check.sh [DIR]      # default gpu-bundle/; needs root (unshare -m)
#
# 1. closure: every ELF of DIR needs only libraries inside DIR or on its provided list;
# 2. the bundled launcher starts `mfsdp-train` on configs/tiny_test.json at -np 1, 2 and 4 (the same
#    global batch, so the same state fingerprint) on CPU ranks, in a
#    mount namespace where every file of this machine's Open MPI, PMIx, hwloc (with its plugins)
#    and libevent packages is hidden (/dev/null bound over it), and the loader's log (LD_DEBUG=libs)
#    of every process shows each library it initialised coming from DIR or from the provided list (here the CUDA
#    toolkit stands in for the GPU machine's wheels).
# Prints "N passed, N failed"; exit 0 only when every check passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(cd "${1:-$ROOT/gpu-bundle}" 2>/dev/null && pwd)" ||
  { echo "no bundle at ${1:-gpu-bundle}: run scripts/gpu_prepare.sh first"; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "the launch check hides the system's Open MPI with unshare -m: run it as root"; exit 2; }
PASSED=0
FAILED=0
result() {  # result NAME RC
  if [ "$2" = 0 ]; then echo "PASS $1"; PASSED=$((PASSED + 1)); else echo "FAIL $1"; FAILED=$((FAILED + 1)); fi
}
closure() { python3 "$DIR/bundle_closure.py" "$1" "$DIR" --provided "$DIR/provided_libs.txt" "${@:2}"; }

closure check
result "closure" $?

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
HIDE=()
for pkg in libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libhwloc-plugins libevent-core-2.1-7 libevent-pthreads-2.1-7; do
  while read -r f; do
    case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
    [ -f "$f" ] && [ ! -L "$f" ] && HIDE+=("$f")
  done < <(dpkg -L "$pkg" 2>/dev/null)
done
echo "hiding ${#HIDE[@]} files of the system's Open MPI, PMIx, hwloc and libevent"
[ ${#HIDE[@]} -gt 100 ] || { echo "dpkg lists too few Open MPI files to hide"; exit 2; }

cat >"$WORK/launch.sh" <<'EOF'
set -u
WORK="$1"; DIR="$2"; ROOT="$3"; NP="$4"; shift 4
for f in "$@"; do mount --bind /dev/null "$f" || exit 3; done
[ -s /usr/bin/orterun ] && { echo "the system's orterun is still visible"; exit 3; }
source "$DIR/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "mpirun: $(command -v mpirun)"
cd "$ROOT/configs"
LD_DEBUG=libs LD_DEBUG_OUTPUT="$WORK/ld_np$NP/trace" \
  mpirun -np "$NP" --oversubscribe --bind-to none mfsdp-train --config tiny_test.json \
    --set training.steps=3 --set training.grad_accum=$((4 / NP)) --set training.eval_interval=0 \
    --set training.sample_tokens=0 --set logging.run_dir="$WORK/run_np$NP" --threads 1
EOF
# World sizes 1, 2 and 4 with 4, 2 and 1 micro-batches per rank: the same global batch, so the runs
# must end in the same state fingerprint (bitwise, as the main build's tests require).
for np in 1 2 4; do
  mkdir -p "$WORK/ld_np$np"
  unshare -m --propagation private bash "$WORK/launch.sh" "$WORK" "$DIR" "$ROOT" "$np" "${HIDE[@]}" \
    >"$WORK/launch_np$np.log" 2>&1
  rc=$?
  tail -3 "$WORK/launch_np$np.log"
  [ "$rc" = 0 ] && [ -f "$WORK/run_np$np/summary.json" ]
  result "bundled mpirun -np $np mfsdp-train with the system's Open MPI hidden (rc=$rc)" $?
  closure loaded --traces "$WORK/ld_np$np" --mpi-processes "$np"
  result "-np $np: every library the launcher and the ranks loaded is the bundle's or on the provided list" $?
done
python3 - "$WORK" <<'EOF'
import json, os, sys
prints = {np: json.load(open(os.path.join(sys.argv[1], f"run_np{np}", "summary.json"))).get("state_fingerprint")
          for np in (1, 2, 4) if os.path.exists(os.path.join(sys.argv[1], f"run_np{np}", "summary.json"))}
print(f"state fingerprints: {prints}")
sys.exit(0 if len(prints) == 3 and len(set(prints.values())) == 1 and None not in prints.values() else 1)
EOF
result "world sizes 1, 2 and 4 end in the same state fingerprint" $?

echo "gpu bundle cpu check: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
