#!/usr/bin/env bash
# Creates the test-only Python environment .venv-test/ (cached): Debian's python3 with its site
# packages visible (torch, numpy), plus tiktoken (reference GPT-2 encoder for the tokenizer tests) and
# transformers + safetensors (Hugging Face interoperability checks; transformers < 4.45 because later
# releases need torch >= 2 and Debian's python3-torch is older). Never used by the product.
# Fast when cached. Exit status: 0 when ready, 1 when PyPI cannot be reached (tests that need the
# environment then skip). Usage: scripts/test_venv.sh [--quiet]
set -uo pipefail
cd "$(dirname "$0")/.."
venv=.venv-test
py=/usr/bin/python3
[ -x "$py" ] || py=python3
stamp="$venv/.ready-v2"
say() { [ "${1:-}" = --quiet ] || echo "test_venv.sh: $*"; }
ready_check='import tiktoken, safetensors, transformers.utils as u; assert u.is_torch_available()'
if [ -f "$stamp" ] && "$venv/bin/python" -c "$ready_check" >/dev/null 2>&1; then
  say "$venv ready (cached)"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv --system-site-packages "$venv" || { say "cannot create $venv"; exit 1; }
fi
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --timeout 20 --retries 1 \
    tiktoken "transformers<4.45" safetensors >"$venv/pip.log" 2>&1; then
  say "pip install failed (PyPI unreachable?); see $venv/pip.log. Tests needing tiktoken or transformers will skip."
  exit 1
fi
touch "$stamp"
say "$venv ready"
