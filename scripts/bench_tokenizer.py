#!/usr/bin/env python3
"""Tokens/s of our GPT-2 encoder (mfsdp-bench-tokenizer) and of tiktoken on the same ~10 MB text
(Tiny Shakespeare repeated), with the same thread counts; prints the ratio ours / tiktoken.

Threads 1: one encode call on the whole text (tiktoken: encode_ordinary). Threads N > 1: the
"\\n\\n"-separated sections in parallel (tiktoken: encode_ordinary_batch(num_threads=N)). Best of
--reps runs each; every run of ours starts with a cold word cache, tiktoken has none.
Run with the test environment: .venv-test/bin/python scripts/bench_tokenizer.py [--build build] [--threads 1 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
from reference_encode import gpt2_encoding  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    base = open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8").read()
    text = base * max(1, round(args.mb * 1e6 / len(base.encode())))
    docs, pos = [], 0
    while pos < len(text):
        at = text.find("\n\n", pos)
        at = len(text) if at < 0 else at + 2
        docs.append(text[pos:at])
        pos = at
    enc = gpt2_encoding(os.path.join(ROOT, "data", "gpt2_tokenizer"))
    exe = os.path.join(args.build, "bin", "mfsdp-bench-tokenizer")
    nbytes = len(text.encode())
    print(f"text: {nbytes / 1e6:.1f} MB, {len(docs)} sections, cpus: {os.cpu_count()}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        for t in args.threads:
            ours = json.loads(subprocess.check_output([exe, path, "--threads", str(t), "--reps", str(args.reps)]))
            best = 1e30
            for _ in range(args.reps):
                t0 = time.perf_counter()
                n = len(enc.encode_ordinary(text)) if t == 1 else sum(
                    len(ids) for ids in enc.encode_ordinary_batch(docs, num_threads=t))
                best = min(best, time.perf_counter() - t0)
            if n != ours["tokens"]:
                print(f"token counts differ: ours {ours['tokens']}, tiktoken {n}", file=sys.stderr)
                return 1
            a, b = ours["tokens"] / ours["seconds"], n / best
            print(f"threads {t}: ours {a / 1e6:.2f} M tokens/s ({nbytes / 1e6 / ours['seconds']:.1f} MB/s), "
                  f"tiktoken {b / 1e6:.2f} M tokens/s ({nbytes / 1e6 / best:.1f} MB/s), ratio ours/tiktoken {a / b:.2f}")
    finally:
        os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
