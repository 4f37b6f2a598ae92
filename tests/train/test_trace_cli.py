#!/usr/bin/env python3
"""The per-rank timeline (logging.trace) of mfsdp-train under mpirun -np 2 (stdlib only).

usage: test_trace_cli.py BIN_DIR CASE   with CASE one of
  window     5 steps of the tiny config (matrixfsdp, 2 micro-batches per rank, prefetch depth 2,
             overlapped reductions, a validation after step 3) traced over steps 2..4; the file
             parses with json and holds one process row per rank; every span has pid and
             args.step; spans of one row nest; each step's phases and collectives lie inside its
             step span; each step's gradient reductions move 4 x parameters x (world - 1) x
             micro-batches bytes (the direct model, summed over ranks) and the run's summary
             counts the same per step; Newton-Schulz runs once per Muon matrix per step, on its
             owner, with the matrix's name and shape; started all-gathers and reduce-scatters sit
             on their own rows; the same run untraced ends in the same state fingerprint and
             traffic. scripts/trace_overlap.py finds each rank's started reductions overlapping its
             backward units in that file, and gives closed-form figures on a hand-made timeline.
             A run whose window lies past its last step writes no file and says so.
  bad_input  logging.trace naming a directory, logging.trace_steps 0 and logging.trace_start 0 exit 2
             naming the key
Exit 0 on success, 1 on failure.
"""
import json
import os
import re
import subprocess
import sys
from collections import defaultdict

from cli_common import ENV, ROOT, TINY, check, run_case, with_run_dir

EPS = 0.002  # microseconds: ts and dur are written with three decimals


def train(bin_dir, *sets):
    """mpirun -np 2 mfsdp-train on the tiny config with `sets` as --set; (exit code, output)."""
    cmd = ["mpirun", "-np", "2", "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config", TINY,
           "--threads", "1"]
    for s in with_run_dir(sets):
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def check_nesting(spans):
    """Spans of one (pid, tid) row: any two are disjoint or one holds the other."""
    stack = []
    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + EPS:
            stack.pop()
        if stack:
            top = stack[-1]
            check(e["ts"] + e["dur"] <= top["ts"] + top["dur"] + EPS,
                  f"pid {e['pid']} tid {e['tid']}: {e['name']} at {e['ts']} (+{e['dur']}) overlaps "
                  f"{top['name']} at {top['ts']} (+{top['dur']}) without nesting")
        stack.append(e)


def check_structure(events, steps):
    meta = [e for e in events if e.get("ph") == "M"]
    spans = [e for e in events if e.get("ph") == "X"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    check(names == {0: "rank 0", 1: "rank 1"}, f"process rows {names}")
    for e in spans:
        ok = e.get("pid") in (0, 1) and isinstance(e.get("tid"), int) and e.get("args", {}).get("step") in steps
        ok = ok and e["dur"] >= 0 and e["ts"] >= 0
        check(ok, f"span without rank, lane or a traced step: {e}")
    rows = defaultdict(list)
    for e in spans:
        rows[(e["pid"], e["tid"])].append(e)
    for row in rows.values():
        check_nesting(row)
    for pid in (0, 1):
        step_spans = {e["args"]["step"]: e for e in spans if e["pid"] == pid and e["cat"] == "step"}
        check(sorted(step_spans) == steps, f"rank {pid}: step spans {sorted(step_spans)}")
        phases = [e for e in spans if e["pid"] == pid and e["cat"] != "step"]  # collectives too
        check(len({e["name"] for e in phases} & {"forward", "backward", "reduce", "loss", "optimizer", "step statistics"}) == 6,
              f"rank {pid}: phases {sorted({e['name'] for e in phases})}")
        for e in phases:
            s = step_spans.get(e["args"]["step"])
            check(s is not None and s["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + EPS,
                  f"rank {pid}: {e['name']} of step {e['args']['step']} lies outside its step span")
    lanes = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    check({"schedule", "collectives", "prefetch", "reduce"} <= lanes, f"lanes {sorted(lanes)}")
    return spans


def check_collectives(spans, steps, parameters, accum, summary):
    coll = [e for e in spans if e["cat"] == "collective"]
    for e in coll:
        a = e["args"]
        check(isinstance(a.get("bytes"), int) and a["bytes"] >= 0 and isinstance(a.get("op"), str) and "phase" in a,
              f"collective without op, phase or bytes: {e}")
    for step in steps:
        red = [e for e in coll if e["args"]["step"] == step and e["args"]["phase"] == "grad_reduce"]
        total = sum(e["args"]["bytes"] for e in red)
        check(total == 4 * parameters * (2 - 1) * accum,
              f"step {step}: reductions move {total} bytes, expected 4 x {parameters} x {accum}")
        check(all(e["args"]["op"] == "reduce_scatter_v" and e["args"].get("started") for e in red),
              f"step {step}: reductions not all started reduce_scatter_v")
        gathers = [e for e in coll if e["args"]["step"] == step and e["args"]["op"] == "all_gather_v"]
        # each gather is on both ranks with the same elements; its bytes over the ranks are 4 x elements
        sent, elements = sum(e["args"]["bytes"] for e in gathers), sum(e["args"]["elements"] for e in gathers)
        check(gathers and sent > 0 and 2 * sent == 4 * elements and elements >= 2 * 2 * parameters,
              f"step {step}: all-gathers send {sent} bytes for {elements} elements (2 ranks)")
    check(summary["comm_bytes"]["grad_reduce"] == 5 * 4 * parameters * accum,
          f"summary grad_reduce bytes {summary['comm_bytes']['grad_reduce']} != 5 steps of the trace's")
    lane_of = lambda e: e["tid"]
    names = {}
    for e in coll:
        if e["args"].get("started"):
            names.setdefault(e["args"]["op"], set()).add(lane_of(e))
    check(names.get("all_gather_v") and names.get("reduce_scatter_v")
          and not names["all_gather_v"] & names["reduce_scatter_v"],
          f"started all-gathers and reduce-scatters share rows: {names}")


def span_matrices(e):
    """The matrices a Newton-Schulz span orthogonalized: one (named by the span and args.matrix) or a
    batch of same-shape matrices (span "batch", args.names, as many as args.matrices)."""
    a = e["args"]
    if e["name"] == "batch":
        return a["names"] if len(a.get("names", [])) == a["matrices"] >= 2 else [None]
    return [a.get("matrix")] if e["name"] == a.get("matrix") and a["matrices"] == 1 else [None]


def check_newton_schulz(spans, steps, muon_matrices):
    ns = [e for e in spans if e["cat"] == "newton_schulz"]
    batched = sum(e["name"] == "batch" for e in ns)
    check(batched > 0, "no batched Newton-Schulz span (same-shape matrices are orthogonalised as a batch)")
    for step in steps:
        here = [e for e in ns if e["args"]["step"] == step]
        matrices = [m for e in here for m in span_matrices(e)]
        check(None not in matrices and len(matrices) == muon_matrices and len(set(matrices)) == muon_matrices,
              f"step {step}: Newton-Schulz on {matrices}, expected each of {muon_matrices} matrices once")
        check(all(len(e["args"]["shape"]) == 2 and min(e["args"]["shape"]) > 0 for e in here),
              f"step {step}: Newton-Schulz spans without a shape")
        check({e["pid"] for e in here} == {0, 1}, f"step {step}: Newton-Schulz ran on ranks {[e['pid'] for e in here]}")
    owner = {}
    for e in ns:
        for m in span_matrices(e):
            owner.setdefault(m, set()).add(e["pid"])
    check(all(len(p) == 1 for p in owner.values()), f"a matrix orthogonalized on two ranks: {owner}")


def trace_overlap(path, *flags):
    """scripts/trace_overlap.py on `path`: (exit code, stdout)."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "trace_overlap.py"), path, *flags],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout


def check_overlap_report(path, tmp):
    """The run's trace shows every rank's reductions overlapping its backward units; the arithmetic
    holds on a hand-made timeline: backward units [0, 10) and [10, 20) us, started reductions
    [5, 15) and [18, 30): 10 + 12 us of reduction (union 22), 10 + 2 us of it under units."""
    rc, out = trace_overlap(path, "--json", "--require-overlap")
    check(rc == 0, f"trace_overlap.py --require-overlap on the run's trace: exit {rc}: {out[-600:]}")
    if rc == 0:
        for rank, r in json.loads(out)["ranks"].items():
            check(r["reductions"] > 0 and 0 < r["overlapped_ms"] <= r["reduce_ms"] + 1e-9 and r["backward_ms"] > 0,
                  f"rank {rank}: overlap report {r}")
    X = lambda name, cat, ts, dur, **args: {"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": 1, "ts": ts,
                                            "dur": dur, "args": dict(step=1, **args)}
    red = dict(op="reduce_scatter_v", phase="grad_reduce", started=True)
    events = [X("backward", "phase", 0, 20), X("backward unit", "phase", 0, 10), X("backward unit", "phase", 10, 10),
              X("reduce_scatter_v", "collective", 5, 10, **red), X("reduce_scatter_v", "collective", 18, 12, **red)]
    made = os.path.join(tmp, "made.json")
    with open(made, "w") as f:
        json.dump({"traceEvents": events}, f)
    rc, out = trace_overlap(made, "--json")
    r = json.loads(out)["ranks"]["0"] if rc == 0 else {}
    check(rc == 0 and r.get("reductions") == 2 and abs(r.get("reduce_ms", 0) - 0.022) < 1e-12
          and abs(r.get("overlapped_ms", 0) - 0.012) < 1e-12 and abs(r.get("backward_ms", 0) - 0.020) < 1e-12,
          f"hand-made timeline: exit {rc}, report {r}")
    with open(made, "w") as f:  # blocking reductions only: nothing started, nothing overlaps
        json.dump({"traceEvents": events[:3] + [X("reduce_scatter_v", "collective", 5, 10, op="reduce_scatter_v",
                                                  phase="grad_reduce")]}, f)
    rc, _ = trace_overlap(made, "--require-overlap")
    check(rc == 1, f"--require-overlap without started reductions: exit {rc}, expected 1")


def case_window(bin_dir, tmp):
    path = os.path.join(tmp, "traces", "run.json")
    run_dir = os.path.join(tmp, "run")
    accum = 2
    # the validation after step 3 lies inside the window: it is not traced (spans only inside steps)
    # four blocks on two ranks: some rank owns two matrices of a shape, which it orthogonalizes as a batch
    rc, out = train(bin_dir, f"logging.trace={path}", "training.steps=5", f"training.grad_accum={accum}",
                    "training.eval_interval=3", "training.sample_tokens=0", "sharding.prefetch_depth=2",
                    "sharding.overlap_reduce=on", f"logging.run_dir={run_dir}", "model.n_layer=4")
    check(rc == 0, f"traced run failed ({rc}): {out[-2000:]}")
    if rc:
        return
    check("trace of steps 2..4 written to " + path in out, "no line naming the trace file")
    with open(path) as f:
        doc = json.load(f)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    muon = int(re.search(r"Muon: (\d+) matrices", out).group(1))
    steps = [2, 3, 4]
    spans = check_structure(doc["traceEvents"], steps)
    check_collectives(spans, steps, summary["parameters"], accum, summary)
    check_newton_schulz(spans, steps, muon)
    check_overlap_report(path, tmp)
    print(f"window: {len(spans)} spans, {muon} Muon matrices, {summary['parameters']} parameters")

    plain_dir = os.path.join(tmp, "plain")  # tracing changes no result
    rc, out = train(bin_dir, "training.steps=5", f"training.grad_accum={accum}", "training.eval_interval=3",
                    "training.sample_tokens=0", "sharding.prefetch_depth=2", "sharding.overlap_reduce=on",
                    f"logging.run_dir={plain_dir}", "model.n_layer=4")
    check(rc == 0, f"untraced run failed ({rc}): {out[-1000:]}")
    if rc == 0:
        with open(os.path.join(plain_dir, "summary.json")) as f:
            plain = json.load(f)
        check(plain["state_fingerprint"] == summary["state_fingerprint"]
              and plain["comm_bytes"] == summary["comm_bytes"],
              "the traced run's state or traffic differs from the untraced run's")

    late = os.path.join(tmp, "late.json")
    rc, out = train(bin_dir, f"logging.trace={late}", "logging.trace_start=4", "training.steps=3",
                    "training.eval_interval=0", "training.sample_tokens=0")
    check(rc == 0 and not os.path.exists(late) and "took no step of the trace window" in out,
          f"a window past the run: rc {rc}, file {os.path.exists(late)}: {out[-800:]}")


def case_bad_input(bin_dir, tmp):
    for sets, key in [([f"logging.trace={tmp}"], "logging.trace"),
                      ([f"logging.trace={tmp}/t.json", "logging.trace_steps=0"], "logging.trace_steps"),
                      ([f"logging.trace={tmp}/t.json", "logging.trace_start=0"], "logging.trace_start")]:
        rc, out = train(bin_dir, *sets, "training.steps=2")
        check(rc == 2 and key in out, f"{sets}: exit {rc}, expected 2 naming {key}: {out[-600:]}")


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp_trace"))
