#!/usr/bin/env bash
# Fetches the header-only cuDNN C++ frontend (graph API) that runtime/cuda/cudnn_attention.cpp is
# compiled against: the pinned PyPI wheel nvidia-cudnn-frontend (its sha256 checked), of which only
# the include/ tree is unpacked into .deps/cudnn_frontend-<version>/include (git-ignored). Idempotent:
# returns at once when that tree is complete. CMake finds it there (MFSDP_CUDNN_FRONTEND_INCLUDE_DIR).
#
#   scripts/fetch_cudnn_frontend.sh [--wheel FILE]   # FILE: a local copy of the pinned wheel
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.32.0
WHEEL=nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
DEST=".deps/cudnn_frontend-$VERSION"
STAMP="$DEST/.complete"

local_wheel=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) local_wheel="${2:?--wheel needs a file}"; shift 2 ;;
    *) echo "fetch_cudnn_frontend.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

if [ -f "$STAMP" ] && [ -f "$DEST/include/cudnn_frontend.h" ]; then
  echo "fetch_cudnn_frontend.sh: cuDNN frontend $VERSION present in $DEST"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -n "$local_wheel" ]; then
  cp "$local_wheel" "$tmp/$WHEEL"
else
  echo "fetch_cudnn_frontend.sh: downloading nvidia-cudnn-frontend==$VERSION (PyPI wheel)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$VERSION" -d "$tmp" >&2
fi
[ -f "$tmp/$WHEEL" ] || { echo "fetch_cudnn_frontend.sh: expected $WHEEL, got: $(ls "$tmp")" >&2; exit 1; }
got="$(sha256sum "$tmp/$WHEEL" | cut -d' ' -f1)"
if [ "$got" != "$SHA256" ]; then
  echo "fetch_cudnn_frontend.sh: sha256 mismatch for $WHEEL: got $got, expected $SHA256" >&2
  exit 1
fi
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$tmp/$WHEEL" "$DEST" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and ".." not in n.split("/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit(f"fetch_cudnn_frontend.sh: {wheel} has no include/cudnn_frontend.h")
    z.extractall(dest, names)
PY
touch "$STAMP"
echo "fetch_cudnn_frontend.sh: cuDNN frontend $VERSION headers in $DEST/include"
