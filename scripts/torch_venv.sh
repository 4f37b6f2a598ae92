#!/usr/bin/env bash
# Creates .venv-torch/: the current PyTorch wheel from PyPI (2.15) and numpy, for the side-by-side
# CPU benchmarks of scripts/bench_vs_pytorch.py. Never used by the product or the tests. The CUDA
# wheel imports on a machine without a GPU once the NVIDIA libraries it links but does not declare
# are present: nvidia-cufile, nvidia-cusparselt-cu13, nvidia-nvshmem-cu13 and nvidia-nccl-cu13,
# installed without their dependencies; bench_vs_pytorch.py puts every nvidia/*/lib folder of the
# environment on LD_LIBRARY_PATH before it starts PyTorch. Cached: fast when ready.
# Usage: scripts/torch_venv.sh [VENV_DIR]   (default .venv-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-torch}"
stamp="$venv/.ready-torch-2.15"
if [ -f "$stamp" ]; then
  echo "torch_venv.sh: $venv ready (cached)"
  exit 0
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==2.15.*" numpy
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 nvidia-nccl-cu13
libs=$(find "$venv" -path '*/nvidia/*/lib' -type d | tr '\n' ':')
LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}" "$venv/bin/python" -c \
  'import torch; print("torch_venv.sh: torch", torch.__version__, "imports;", torch.backends.mkldnn.is_available() and "oneDNN available" or "no oneDNN")'
touch "$stamp"
