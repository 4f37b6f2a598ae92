#!/usr/bin/env bash
# The main job: trains the default GPT on character-level Tiny Shakespeare with matrixfsdp + Muon
# on 2 MPI ranks. Extra arguments go to mfsdp-train (e.g. --set training.steps=200). Run again, it
# continues from the newest checkpoint in the run directory (a finished run only re-evaluates).
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-2}
CONFIG=${CONFIG:-configs/shakespeare_char.json}
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun -np "$NP" --oversubscribe --bind-to none build/bin/mfsdp-train --config "$CONFIG" \
  --set training.resume=auto "$@"
