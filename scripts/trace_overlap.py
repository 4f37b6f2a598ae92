#!/usr/bin/env python3
"""How much of each rank's gradient reductions a timeline shows overlapping the backward (stdlib only).

usage: trace_overlap.py TRACE [--json] [--require-overlap]

TRACE is the Chrome-trace JSON of `logging.trace` (runtime/README.md, "The timeline"). Per rank
and over the traced steps it reports:
  backward_ms    the time inside the steps' `backward` spans;
  reductions     the started gradient reduce-scatters (collective spans with args.started and
                 args.phase grad_reduce: from their start to the end of their wait);
  reduce_ms      the time those spans cover (their union);
  overlapped_ms  the part of reduce_ms during which a `backward unit` span (the compute of a unit's
                 backward) runs on the rank's schedule row;
  overlap        overlapped_ms / reduce_ms.
A span covers its start-to-wait interval, so the figure says the schedule let the reduction run
while units computed: on CPU ranks MPI progresses it inside that interval, on CUDA ranks (event
times) it is queued on the communication stream while the compute stream works.

--json prints one JSON object {"ranks": {rank: {...}}} instead of the table. --require-overlap
exits 1 unless every rank has at least one reduction and a positive overlapped time. Exit 2 on a
file that is not such a trace.
"""
import argparse
import json
import sys
from collections import defaultdict


def union(intervals):
    """Disjoint, sorted union of (begin, end) intervals."""
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out


def covered(a, b):
    """Length of the intersection of two disjoint sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def span(e):
    return (float(e["ts"]), float(e["ts"]) + float(e["dur"]))


def overlap_by_rank(events):
    """{rank: {backward_ms, reductions, reduce_ms, overlapped_ms, overlap}} from trace events."""
    by_rank = defaultdict(lambda: {"backward": [], "units": [], "reduce": []})
    for e in events:
        if e.get("ph") != "X":
            continue
        r = by_rank[e["pid"]]
        args = e.get("args", {})
        if e.get("cat") == "collective" and args.get("started") and args.get("phase") == "grad_reduce":
            r["reduce"].append(span(e))
        elif e.get("name") == "backward":
            r["backward"].append(span(e))
        elif e.get("name") == "backward unit":
            r["units"].append(span(e))
    out = {}
    for rank in sorted(by_rank):
        r = by_rank[rank]
        reduce = union(r["reduce"])
        reduce_us = sum(e - b for b, e in reduce)
        overlapped_us = covered(reduce, union(r["units"]))
        out[rank] = {
            "backward_ms": sum(e - b for b, e in union(r["backward"])) / 1e3,
            "reductions": len(r["reduce"]),
            "reduce_ms": reduce_us / 1e3,
            "overlapped_ms": overlapped_us / 1e3,
            "overlap": overlapped_us / reduce_us if reduce_us > 0 else 0.0,
        }
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--require-overlap", action="store_true",
                    help="exit 1 unless every rank shows reductions overlapping its backward")
    a = ap.parse_args(argv)
    try:
        with open(a.trace) as f:
            events = json.load(f)["traceEvents"]
        ranks = overlap_by_rank(events)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        print(f"trace_overlap.py: {a.trace}: not a logging.trace timeline ({err})", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"ranks": ranks}))
    else:
        print(f"{'rank':>4} {'backward ms':>12} {'reductions':>10} {'reduce ms':>10} {'overlapped ms':>14} {'overlap':>8}")
        for rank, r in ranks.items():
            print(f"{rank:>4} {r['backward_ms']:>12.3f} {r['reductions']:>10} {r['reduce_ms']:>10.3f} "
                  f"{r['overlapped_ms']:>14.3f} {100 * r['overlap']:>7.1f}%")
    if a.require_overlap:
        bad = [rank for rank, r in ranks.items() if r["reductions"] == 0 or r["overlapped_ms"] <= 0]
        if not ranks or bad:
            print(f"trace_overlap.py: no reduction overlaps the backward on rank(s) {bad or 'any'}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
