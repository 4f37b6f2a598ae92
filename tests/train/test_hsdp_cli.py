#!/usr/bin/env python3
"""mfsdp-train with HSDP (sharding.replicate) under mpirun (stdlib only).

usage: test_hsdp_cli.py BIN_DIR CASE   with CASE one of
  world1   -np 4 as 2 replicas x 2 shard ranks (matrixfsdp and fsdp2) and -np 6 as 2 x 3, one
           micro-batch per rank, against -np 1 with the same global batch as micro-batches:
           the same loss lines, metrics, state fingerprint and a byte-identical export (cmp);
           the checkpoint written by replica 0 resumes on the plain world
  refused  replicate with ddp, or not dividing the world, exits 2 naming the key
Exit 0 on success, 1 on failure.
"""
import json
import os
import re
import subprocess
import sys

from cli_common import ENV, TINY, check, read_jsonl, run_case, with_run_dir

LOSS_LINE = re.compile(r"step\s+(\d+)/\d+ \| loss (\S+) \| lr (\S+) \| grad norm (\S+)")


def train(bin_dir, np, *sets):
    """mpirun -np NP mfsdp-train on the tiny config with each of `sets` as --set (in a fresh run
    directory unless one of them names logging.run_dir). Returns (exit code, stdout + stderr)."""
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config", TINY,
           "--threads", "1"]
    for s in with_run_dir(sets):
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def run(bin_dir, tmp, name, np, accum, *sets):
    run_dir = os.path.join(tmp, name)
    model = os.path.join(tmp, name + ".safetensors")
    rc, out = train(bin_dir, np, f"logging.run_dir={run_dir}", f"training.grad_accum={accum}",
                    "training.micro_batch_size=2", "training.steps=6", "training.eval_interval=3",
                    "training.sample_tokens=0", f"output.export={model}", *sets)
    check(rc == 0, f"{name}: -np {np} failed ({rc}): {out[-1500:]}")
    if rc:
        return None
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    records = [(m["type"], m["step"], m.get("loss"), m.get("grad_norm"), m.get("val_loss"))
               for m in read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if m["type"] in ("train", "eval")]
    with open(model, "rb") as f:
        exported = f.read()
    print(f"{name}: -np {np} x grad_accum {accum}: fingerprint {summary['state_fingerprint']}, "
          f"world_size {summary.get('world_size')}, replicas {summary.get('replicas')}")
    return LOSS_LINE.findall(out), records, summary, exported


def case_world1(bin_dir, tmp):
    refs = {}
    for np, R, placement in [(4, 2, "matrixfsdp"), (4, 2, "fsdp2"), (6, 2, "matrixfsdp")]:
        if np not in refs:
            refs[np] = run(bin_dir, tmp, f"ref{np}", 1, np)
        ref = refs[np]
        got = run(bin_dir, tmp, f"hsdp{np}_{placement}", np, 1, f"sharding.replicate={R}",
                  f"sharding.placement={placement}")
        if not ref or not got:
            return
        check(len(ref[0]) == 6, "missing loss lines")
        check(got[0] == ref[0], f"{placement} {R}x{np // R}: loss lines differ from -np 1")
        check(got[1] == ref[1], f"{placement} {R}x{np // R}: metrics differ from -np 1")
        check(got[2]["state_fingerprint"] == ref[2]["state_fingerprint"], f"{placement}: fingerprint differs")
        check(got[3] == ref[3], f"{placement} {R}x{np // R}: export differs from -np 1 (cmp)")
        check(got[2].get("world_size") == np and got[2].get("replicas") == R, f"summary world/replicas: {got[2]}")
    # replica 0's checkpoint of the 2x2 run resumes on 2 plain ranks with the same fingerprint
    ckpt_run = os.path.join(tmp, "hsdp4_matrixfsdp")
    rc, out = train(bin_dir, 2, f"logging.run_dir={os.path.join(tmp, 'resumed')}", "training.resume=auto",
                    f"checkpoint.dir={os.path.join(ckpt_run, 'checkpoints')}", "training.steps=8",
                    "training.micro_batch_size=2", "training.grad_accum=2", "training.sample_tokens=0", "data.val=")
    check(rc == 0 and "step_00000006" in out, f"resume of the HSDP checkpoint failed ({rc}): {out[-1500:]}")
    return 0


def case_refused(bin_dir, tmp):
    rc, out = train(bin_dir, 4, "sharding.replicate=2", "sharding.placement=ddp")
    check(rc == 2 and "sharding.replicate" in out and "ddp" in out, f"ddp with replicate: rc {rc}: {out[-800:]}")
    rc, out = train(bin_dir, 4, "sharding.replicate=3")
    check(rc == 2 and "does not divide the world size 4" in out, f"replicate 3 at -np 4: rc {rc}: {out[-800:]}")
    return 0


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp_hsdp"))
