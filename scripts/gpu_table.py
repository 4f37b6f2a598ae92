#!/usr/bin/env python3
"""The table of the GPU check, from two mfsdp-train runs' metrics.jsonl (stdlib only).

usage: gpu_table.py GPU_METRICS CPU_METRICS
GPU_METRICS: the GPU run (logging.interval 1); CPU_METRICS: the CPU f32 reference on the same data
(may be missing or partial). Prints throughput, MFU, ms per phase, the optimizer step, peak
memory, raw allocations (cudaMalloc) after step 2, the step telemetry, then the losses of the
first steps side by side and the GPU loss at its last step. Exit 1 when the GPU metrics are
missing or show cudaMallocs after step 2; 0 otherwise.
"""
import json
import os
import statistics
import sys


def train_records(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [m for m in (json.loads(line) for line in f if line.strip()) if m.get("type") == "train"]


def main():
    gpu, cpu = train_records(sys.argv[1]), train_records(sys.argv[2])
    if not gpu:
        print(f"no GPU train records in {sys.argv[1]}")
        return 1
    steady = gpu[2:] if len(gpu) > 3 else gpu  # steps 3.. (the first steps warm caches and cuBLAS)
    med = lambda key: statistics.median(m["seconds"][key] for m in steady) * 1e3
    by_step = {m["step"]: m for m in gpu}
    raw2 = by_step.get(2, gpu[0])["rank0"]["raw_allocs"]
    raw_last = gpu[-1]["rank0"]["raw_allocs"]
    peak3 = by_step.get(3, gpu[0])["rank0"]["peak_total_bytes"]
    peak_last = gpu[-1]["rank0"]["peak_total_bytes"]
    tel = gpu[-1].get("rank0_step", {})
    rows = [
        ("tokens/s (median, steps 3..)", f"{statistics.median(m['tokens_per_second'] for m in steady):,.0f}"),
        ("MFU (median, peak from the config)", f"{100 * statistics.median(m['mfu'] for m in steady):.1f}%"),
        ("step ms (median)", f"{med('step'):.1f}"),
        ("  forward / backward / reduce ms", f"{med('forward'):.1f} / {med('backward'):.1f} / {med('reduce'):.1f}"),
        ("  optimizer step ms", f"{med('optimizer'):.1f}"),
        ("peak tracked memory, step 3 -> last", f"{peak3 / 2**30:.2f} GiB -> {peak_last / 2**30:.2f} GiB"),
        ("cudaMalloc calls after step 2", f"{raw_last - raw2}"),
        ("orthogonalizations in the last step", f"{tel.get('orthogonalizations')}"),
        ("optimizer-step bytes in the last step", f"{tel.get('optimizer_step_bytes')}"),
        ("host<->device bytes in the last step", f"{tel.get('host_device_bytes')}"),
    ]
    width = max(len(r[0]) for r in rows)
    print("\n== GPU training check ==")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    cpu_loss = {m["step"]: m["loss"] for m in cpu}
    print("\n  step  GPU bf16 loss  CPU f32 loss  diff")
    for s in range(1, 11):
        g = by_step.get(s, {}).get("loss")
        c = cpu_loss.get(s)
        diff = f"{g - c:+.4f}" if g is not None and c is not None else ""
        fmt = lambda x: f"{x:12.4f}" if x is not None else f"{'-':>12}"
        print(f"  {s:4d}  {fmt(g)}  {fmt(c)}  {diff}")
    print(f"  GPU loss at step {gpu[-1]['step']}: {gpu[-1]['loss']:.4f}")
    if raw_last != raw2:
        print("FAILED: the block cache called cudaMalloc after step 2")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
