#!/usr/bin/env python3
"""Newton-Schulz (Muon's orthogonalisation) timing: MatrixFSDP's CPU kernel vs PyTorch fp32.

Workload: GPT-2 124M's Muon matrices, 5 quintic steps each, one layer timed and x12 reported:
c_attn 2304x768 (whole, or as 3 blocks of 768x768 with split_qkv), attn c_proj 768x768,
mlp c_fc 3072x768, mlp c_proj 768x3072 ([fan_out, fan_in]; the iteration runs on the wide side).

Ours: the hidden Catch2 case `test_optim "[.bench]"` (tests/optim/test_muon.cpp) prints one
`ns_bench ...` line per (threads, split_qkv). PyTorch: the same iteration
(a, b, c = 3.4445, -4.7750, 2.0315; X = G / (||G||_F + 1e-7); A = X X^T; X = a X + (b A + c A A) X),
fp32, run in a fresh interpreter per thread count (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set
before torch is imported, torch.set_num_threads(t)). The script prints which libblas torch
resolved: Debian's python3-torch links the generic libblas.so.3, which is netlib's reference BLAS
unless an optimised one (OpenBLAS) is the selected alternative -- pass --torch-blas-dir DIR (a
directory holding an optimised libblas.so.3) to put it first on torch's LD_LIBRARY_PATH.

Best-of-N wall times; on a shared machine run it more than once (cpu_s ~ threads x wall means
the cores were ours). Usage:
  python3 scripts/bench_newton_schulz.py --test-binary build/tests/optim/test_optim [--threads 1,2]
"""
import argparse
import os
import subprocess
import sys

SHAPES = {
    0: [(2304, 768), (768, 768), (3072, 768), (768, 3072)],
    1: [(768, 768)] * 3 + [(768, 768), (3072, 768), (768, 3072)],
}

TORCH_CHILD = r"""
import json, os, sys, time
import torch
threads, reps, split = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
shapes = json.loads(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)

def ns(G, steps=5):
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G / (G.norm() + 1e-7)
    t = G.size(0) > G.size(1)
    if t:
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if t else X

gs = [torch.randn(r, c, dtype=torch.float32) for r, c in shapes]
with torch.no_grad():
    for g in gs:
        ns(g)
    best, best_cpu = float("inf"), 0.0
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        for g in gs:
            ns(g)
        s = time.perf_counter() - t0
        if s < best:
            best, best_cpu = s, time.process_time() - c0
blas = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l.split()[-1]})
print(json.dumps({"layer_s": best, "cpu_s": best_cpu, "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "blas": [os.path.realpath(b) for b in blas]}))
"""


def flops_per_layer(split):
    total = 0.0
    for r, c in SHAPES[split]:
        m, n = min(r, c), max(r, c)
        total += 5 * (4.0 * m * m * n + 2.0 * m * m * m)
    return total


def run_ours(binary, threads, reps):
    env = dict(os.environ, MFSDP_NS_BENCH_THREADS=",".join(map(str, threads)), MFSDP_NS_BENCH_REPS=str(reps))
    out = subprocess.run([binary, "[.bench]"], env=env, capture_output=True, text=True, check=False)
    rows = {}
    for line in out.stdout.splitlines():
        if not line.startswith("ns_bench "):
            continue
        kv = dict(p.split("=", 1) for p in line.split()[1:])
        rows[(int(kv["threads"]), int(kv["split_qkv"]))] = (float(kv["layer_s"]), float(kv["cpu_s"]))
    if not rows:
        sys.exit(f"no ns_bench lines from {binary} (rc {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return rows


def run_torch(python, threads, reps, split, blas_dir):
    import json
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    if blas_dir:
        env["LD_LIBRARY_PATH"] = blas_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    out = subprocess.run([python, "-c", TORCH_CHILD, str(threads), str(reps), str(split), json.dumps(SHAPES[split])],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"torch run failed ({python}, {threads} threads): {out.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test-binary", default="build/tests/optim/test_optim",
                    help="test_optim built from this checkout (ours); '' to skip")
    ap.add_argument("--baseline-binary", action="append", default=[], metavar="LABEL=PATH",
                    help="another test_optim to time the same way (e.g. built from an older commit)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per configuration (best is kept)")
    ap.add_argument("--torch-python", default=sys.executable, help="interpreter with torch ('' to skip)")
    ap.add_argument("--torch-blas-dir", default="", help="directory with an optimised libblas.so.3 for torch")
    ap.add_argument("--layers", type=int, default=12)
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t]

    results = []  # (label, threads, split, layer_s, cpu_s)
    binaries = ([("ours", args.test_binary)] if args.test_binary else []) + [
        tuple(b.split("=", 1)) for b in args.baseline_binary]
    for label, path in binaries:
        for (t, split), (s, cpu) in sorted(run_ours(path, threads, args.reps).items()):
            results.append((label, t, split, s, cpu))
    if args.torch_python:
        blas_seen = None
        for split in (0, 1):
            for t in threads:
                r = run_torch(args.torch_python, t, args.reps, split, args.torch_blas_dir)
                if r is None:
                    continue
                blas_seen = (r["torch"], r["blas"])
                results.append((f"pytorch {r['torch']}", t, split, r["layer_s"], r["cpu_s"]))
        if blas_seen:
            print(f"torch {blas_seen[0]} BLAS: {', '.join(blas_seen[1]) or '(none mapped)'}")

    print(f"\nNewton-Schulz, 5 steps, GPT-2 124M Muon matrices (x{args.layers} layers); best of {args.reps}")
    print(f"{'impl':<28} {'threads':>7} {'split_qkv':>9} {'layer s':>9} {'x' + str(args.layers) + ' s':>8} {'cpu s':>8} {'GFLOP/s':>8}")
    for label, t, split, s, cpu in results:
        print(f"{label:<28} {t:>7} {split:>9} {s:>9.4f} {s * args.layers:>8.2f} {cpu:>8.3f} "
              f"{flops_per_layer(split) / s / 1e9:>8.1f}")
    print("GFLOP/s counts X X^T, A A and B X as general GEMMs (4 m^2 n + 2 m^3 per step, m <= n).")


if __name__ == "__main__":
    main()
