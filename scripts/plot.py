#!/usr/bin/env python3
"""Plots of MatrixFSDP runs, benchmarks and projections (matplotlib; tests and reports only).

  plot.py run RUN_DIR OUT_DIR          loss vs steps and tokens (train, validation), tokens/s, phase times
  plot.py bench BENCH.json... OUT_DIR  optimizer-step ms per placement (mfsdp-bench --json), one group per file
  plot.py projection PROJ.json OUT_DIR fsdp2/matrixfsdp ratio and memory per rank vs world size (mfsdp-project --json)
  plot.py check PNG...                 exit 1 unless every PNG is > 5 kB, >= 300x200 pixels and not one colour
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(path)
    return path


def plot_run(run_dir, out_dir):
    train, evals = [], []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("type") == "train":
                train.append(r)
            elif r.get("type") == "eval":
                evals.append(r)
    if not train:
        raise SystemExit(f"plot.py: {run_dir}/metrics.jsonl has no train records")
    steps = [r["step"] for r in train]
    tokens = [r["tokens"] for r in train]
    tokens_at = dict(zip(steps, tokens))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(steps, [r["loss"] for r in train], label="train")
    b.plot(tokens, [r["loss"] for r in train], label="train")
    if evals:
        a.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="validation")
        b.plot([tokens_at.get(r["step"], 0) for r in evals], [r["val_loss"] for r in evals], "o-", label="validation")
    for ax, x in ((a, "step"), (b, "tokens")):
        ax.set_xlabel(x)
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
    _save(fig, out_dir, "loss.png")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(steps, [r["tokens_per_second"] for r in train])
    a.set_xlabel("step")
    a.set_ylabel("tokens/s")
    a.grid(alpha=0.3)
    bottom = [0.0] * len(steps)
    for phase in ("forward", "backward", "reduce", "optimizer"):
        v = [1e3 * r["seconds"][phase] for r in train]
        b.bar(steps, v, bottom=bottom, label=phase)
        bottom = [x + y for x, y in zip(bottom, v)]
    b.set_xlabel("step")
    b.set_ylabel("ms (max over ranks)")
    b.legend()
    _save(fig, out_dir, "throughput_phases.png")


def plot_bench(paths, out_dir):
    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels, groups = [], []
    for p in paths:
        with open(p) as f:
            b = json.load(f)
        for r in b["results"]:
            key = f'W={r["world"]} NS={r["ns_steps"]}'
            if key not in groups:
                groups.append(key)
            if r["placement"] not in labels:
                labels.append(r["placement"])
    width = 0.8 / max(1, len(labels))
    for i, pl in enumerate(labels):
        xs, ys = [], []
        for p in paths:
            with open(p) as f:
                for r in json.load(f)["results"]:
                    if r["placement"] == pl:
                        xs.append(groups.index(f'W={r["world"]} NS={r["ns_steps"]}') + i * width)
                        ys.append(r["ms"]["optimizer"])
        ax.bar(xs, ys, width, label=pl)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels(groups)
    ax.set_ylabel("optimizer step, ms (median, max over ranks)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    _save(fig, out_dir, "bench_optimizer_ms.png")


def plot_projection(path, out_dir):
    with open(path) as f:
        j = json.load(f)
    rows = j["projection"]
    by = {}
    for r in rows:
        by.setdefault(r["placement"], {})[r["world"]] = r
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    if "fsdp2" in by and "matrixfsdp" in by:
        ws = sorted(set(by["fsdp2"]) & set(by["matrixfsdp"]))
        a.plot(ws, [by["fsdp2"][w]["optimizer_ms"] / by["matrixfsdp"][w]["optimizer_ms"] for w in ws], "o-",
               label="optimizer step")
        a.plot(ws, [by["fsdp2"][w]["step_ms"] / by["matrixfsdp"][w]["step_ms"] for w in ws], "s-", label="whole step")
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("world size")
        a.set_ylabel("fsdp2 / matrixfsdp (projected)")
        a.legend()
        a.grid(alpha=0.3)
    for pl, d in by.items():
        ws = sorted(d)
        b.plot(ws, [d[w]["total_gb"] for w in ws], "o-", label=pl)
    b.axhline(j["cluster"]["memory_gb"], color="k", ls="--", label="device memory")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("world size")
    b.set_ylabel("memory per rank, GB (projected)")
    b.legend()
    b.grid(alpha=0.3)
    _save(fig, out_dir, "projection.png")


def check(paths):
    import matplotlib.image as mpimg

    bad = 0
    for p in paths:
        size = os.path.getsize(p) if os.path.exists(p) else 0
        if size <= 5000:
            print(f"{p}: {size} bytes")
            bad += 1
            continue
        img = mpimg.imread(p)
        h, w = img.shape[:2]
        colours = len({tuple(px) for px in img.reshape(-1, img.shape[2])[:: max(1, h * w // 20000)]})
        print(f"{p}: {size} bytes, {w}x{h}, {colours} sampled colours")
        if w < 300 or h < 200 or colours < 3:
            bad += 1
    return 1 if bad else 0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    cmd, args = argv[1], argv[2:]
    if cmd == "run" and len(args) == 2:
        plot_run(*args)
    elif cmd == "bench" and len(args) >= 2:
        plot_bench(args[:-1], args[-1])
    elif cmd == "projection" and len(args) == 2:
        plot_projection(*args)
    elif cmd == "check" and args:
        return check(args)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
