#!/bin/sh
# mfsdp-project --calibrate --device cuda. Without a visible GPU, or in a build without CUDA, it
# must stop with exit 2, say why and write nothing; with a GPU it must write a cluster JSON whose
# source says "measured on <device>" and that the projection loads.
# Usage: calibrate_cuda.sh MFSDP_PROJECT OUT_DIR
set -u
P="$1"
OUT="$2/calibrated_gpu.json"
rm -f "$OUT"
msg=$("$P" --calibrate "$OUT" --device cuda --calibrate-sizes 64 128 2>&1 >/dev/null)
rc=$?
case "$msg" in
  *"no CUDA device is visible"* | *"built without CUDA"*)
    if [ "$rc" = 2 ] && [ ! -e "$OUT" ]; then echo "refused: $msg"; exit 0; fi
    echo "refused with exit $rc (expected 2), or $OUT was written: $msg"
    exit 1 ;;
esac
[ "$rc" = 0 ] || { echo "exit $rc: $msg"; exit 1; }
grep -q '"source": "measured on ' "$OUT" || { echo "$OUT: no \"measured on\" source"; exit 1; }
"$P" --cluster "$OUT" --worlds 8 --placements matrixfsdp >/dev/null || { echo "the projection cannot load $OUT"; exit 1; }
echo "calibrated: $(grep '"name"' "$OUT")"
