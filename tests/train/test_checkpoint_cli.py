#!/usr/bin/env python3
"""End-to-end tests of owner-shard checkpoints under mpirun (stdlib only).

usage: test_checkpoint_cli.py BIN_DIR CASE FAULT_BIN SEAL_BIN   with FAULT_BIN the test_train_faults
binary (tests/train/train_with_faults.cpp), SEAL_BIN test_seal_manifest (tests/train/seal_manifest.cpp)
and CASE one of
  resume     every placement: 4 steps, save, resume, 4 more == 8 uninterrupted steps (export cmp,
             state fingerprint, losses); and a rank killed (SIGKILL from this driver) between two
             checkpoints
  reshard    saved at world 4 (matrixfsdp), resumed at worlds 1, 2, 3 and under fsdp2, zero1, ddp
             with the same global batch and micro-batch shape: bitwise equal to the world-4 run
  crash      a rank dies after writing its file but before the manifest (FAULT_BIN's save
             observer): resume auto takes the previous checkpoint and says it ignored the
             incomplete one
  temporaries  a user's config.json.tmp / summary.json.tmp / latest.tmp and a user's directory named
             like a save's step_N.tmp survive a run; the run's own stale temporaries are removed; a
             save whose step_N.tmp is such a user directory stops the run naming it, and leaves it
  corrupt    damaged or foreign checkpoints: exit 2 on every rank with the file named, before
             training; no checkpoint file is changed (edited manifests are re-sealed, so each
             field's own check is reached)
  lock       two jobs on one checkpoint.dir: the second is refused on every rank naming the first's
             run directory; the first finishes and its checkpoints verify; the lock is free after it
  manifest   edited run-state fields: any edit fails the manifest's checksum; re-sealed edits of the
             loader position, the global batch and the step fail their own checks (the step with
             optimizer_steps: the state fingerprint), a world size beyond 2^24 (2^40, 2^32 + 2) its
             own; exit 2 on every rank, and mfsdp-ckpt verify refuses each one too
  data       the manifest records each data file's content fingerprint: two equal-size train
             shards swapped, or one rewritten with other tokens of the same size, are refused on
             resume (exit 2 on every rank naming the file and model.init_from) and by mfsdp-ckpt
             verify; the unchanged data resumes bitwise equal to the uninterrupted run; a manifest
             without the field (an older build's) resumes with a notice
  tool       mfsdp-ckpt list / verify / export / diff; export replaces an earlier export but refuses
             (exit 2, unchanged) a file that is no export
  full_disk  checkpoints on a full filesystem (a 700 KiB tmpfs; skipped when it cannot be mounted)
  preempt    SIGTERM to mpirun mid-run: a complete checkpoint at the next step boundary, and resuming
             gives the same bytes as an uninterrupted run
  variants   NorMuon (per-row state saved as the Muon tensors' v) with polar_express, split_heads and
             qk_clip: save/resume under matrixfsdp and fsdp2 == the uninterrupted run, resharded from
             world 2 to world 1; a plain-Muon checkpoint is refused by a NorMuon run
Exit 0 on success, 1 on failure, 77 when skipped.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

from cli_common import ENV, TINY, check, merged_sets, mount_small_tmpfs, read, run_case, safetensors_header, start_training

BASE = ["training.sample_tokens=0", "training.eval_interval=0", "logging.interval=1", "data.shuffle=true"]


def command(bin_dir, np, sets):
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config", TINY,
           "--threads", "1"]
    for s in merged_sets(BASE, sets):
        cmd += ["--set", s]
    return cmd


def train(bin_dir, np, *sets, env=None, expect=0):
    p = subprocess.run(command(bin_dir, np, sets), env=env or ENV, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if expect is not None and p.returncode != expect:
        print(out[-3000:])
    return p.returncode, out


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in recs if r["type"] == "train"}





def tree_digest(path):
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            p = os.path.join(d, name)
            h.update(p.encode())
            h.update(read(p))
    return h.hexdigest()


def full_run(bin_dir, tmp, name, np, steps, *sets):
    run = os.path.join(tmp, name)
    rc, out = train(bin_dir, np, f"logging.run_dir={run}", f"training.steps={steps}",
                    f"output.export={run}.safetensors", *sets)
    check(rc == 0, f"{name}: uninterrupted run failed ({rc})")
    return run


def same_as(ref_run, run, what, compare_losses=True):
    check(read(ref_run + ".safetensors") == read(run + ".safetensors"), f"{what}: export differs (cmp)")
    a, b = summary(ref_run), summary(run)
    check(a["state_fingerprint"] == b["state_fingerprint"],
          f"{what}: state_fingerprint {b['state_fingerprint']} != {a['state_fingerprint']}")
    if not compare_losses:  # logged losses are window means; a resumed run's first window is shorter
        return
    ref_losses, got = losses(ref_run), losses(run)
    for step, v in got.items():
        check(ref_losses.get(step) == v, f"{what}: step {step} loss/grad norm {v} != {ref_losses.get(step)}")


def rank_pids(launcher_pid):
    """Process ids of the mfsdp-train ranks that mpirun `launcher_pid` started."""
    return subprocess.run(["pgrep", "-f", "-P", str(launcher_pid), "mfsdp-train"], capture_output=True,
                          text=True).stdout.split()


def killed_run(bin_dir, run, steps, kill_after):
    """`steps` steps with checkpoints every 3; once the log shows step `kill_after`, this driver
    kills one rank (SIGKILL). Returns (exit status, output)."""
    p = subprocess.Popen(command(bin_dir, 2, [f"logging.run_dir={run}", f"training.steps={steps}",
                                              "checkpoint.interval=3"]),
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = ""
    try:
        for line in p.stdout:
            out += line
            m = re.search(r"step +(\d+)/", line)
            if m and int(m.group(1)) >= kill_after:
                break
        pids = rank_pids(p.pid)
        check(len(pids) == 2, f"expected 2 rank processes, found {pids}")
        if pids:
            os.kill(int(pids[0]), signal.SIGKILL)
        out += p.communicate(timeout=300)[0]
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    return p.returncode, out


def newest_checkpoint(root):
    """The step of the newest complete checkpoint (a step_N directory with a manifest) under root; -1 if none."""
    steps = [int(d[5:]) for d in os.listdir(root) if re.fullmatch(r"step_\d{8}", d)
             and os.path.isfile(os.path.join(root, d, "manifest.json"))] if os.path.isdir(root) else []
    return max(steps, default=-1)


def save_fault_run(fault_bin, run, step):
    """8 steps, checkpoints every 3, under test_train_faults: the last rank dies right after it
    wrote its file of the step-`step` checkpoint, before the manifest. The run must fail there."""
    cmd = ["mpirun", "-np", "2", "--oversubscribe", fault_bin, "--config", TINY, "--threads", "1",
           "--die-after-rank-file", str(step)]
    for s in merged_sets(BASE, [f"logging.run_dir={run}", "training.steps=8", "checkpoint.interval=3"]):
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    check(p.returncode != 0, "the run with a crashing save did not fail")
    check(f"[save fault] rank 1 dies after writing" in out and f"step_{step:08d}.tmp" in out,
          f"the save fault did not fire at step {step}: {out[-1500:]}")


def case_resume(bin_dir, tmp):
    # A constant schedule (after warmup), so a 4-step run extended to 8 is the 8-step run; the
    # killed variant below keeps the cosine schedule (same training.steps throughout).
    const = "schedule.decay=constant"
    for placement in ("matrixfsdp", "fsdp2", "zero1", "ddp"):
        ref = full_run(bin_dir, tmp, f"full_{placement}", 2, 8, f"sharding.placement={placement}", const)
        run = os.path.join(tmp, f"split_{placement}")
        rc, _ = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=4", f"sharding.placement={placement}", const)
        check(rc == 0, f"{placement}: first half failed")
        check(os.path.isfile(os.path.join(run, "checkpoints", "step_00000004", "manifest.json")),
              f"{placement}: no checkpoint at the end of the first half")
        rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=8", f"sharding.placement={placement}",
                        "training.resume=auto", f"output.export={run}.safetensors", const)
        check(rc == 0 and "resumed at step 4" in out, f"{placement}: resume failed ({rc})")
        if rc == 0:
            same_as(ref, run, f"{placement} resume")
    # going back to an older checkpoint in the same directory would overwrite the newer ones: refused
    run = os.path.join(tmp, "split_matrixfsdp")
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=8", const, "checkpoint.interval=2",
                    f"training.resume={os.path.join(run, 'checkpoints', 'step_00000004')}", expect=None)
    check(rc == 2 and "would overwrite or prune" in out, f"resume from an older checkpoint into the same dir: {rc} {out[-400:]}")
    # an export inside the checkpoints is refused
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=9", const, "training.resume=auto",
                    f"output.export={os.path.join(run, 'checkpoints', 'step_00000008', 'rank_00000.safetensors')}",
                    expect=None)
    check(rc == 2 and "inside checkpoint.dir" in out, f"export into a checkpoint: {rc} {out[-400:]}")
    # a rank killed (SIGKILL from this driver) once step 4 is logged, checkpoints every 3: the run
    # is long enough that the kill lands long before its end, and resume auto continues from the
    # newest complete checkpoint to the uninterrupted run's bytes
    steps = 600
    ref = full_run(bin_dir, tmp, "full_cosine", 2, steps)
    run = os.path.join(tmp, "killed")
    rc, out = killed_run(bin_dir, run, steps, kill_after=4)
    check(rc != 0 and "done:" not in out, f"the killed run did not fail ({rc}): {out[-800:]}")
    last = newest_checkpoint(os.path.join(run, "checkpoints"))
    check(3 <= last < steps, f"the killed run left no checkpoint before its end (newest: {last})")
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", f"training.steps={steps}", "training.resume=auto",
                    f"output.export={run}.safetensors")
    check(rc == 0 and f"resumed at step {last}" in out, f"resume after kill -9 failed ({rc}): {out[-800:]}")
    if rc == 0:
        same_as(ref, run, "resume after kill -9")


def case_variants(bin_dir, tmp):
    variant = ["schedule.decay=constant", "optimizer.muon.variant=normuon", "optimizer.muon.orthogonalizer=polar_express",
               "optimizer.muon.split_heads=true", "optimizer.muon.qk_clip=0.05"]
    for placement in ("matrixfsdp", "fsdp2"):
        ref = full_run(bin_dir, tmp, f"nfull_{placement}", 2, 8, f"sharding.placement={placement}", *variant)
        run = os.path.join(tmp, f"nsplit_{placement}")
        rc, _ = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=4", f"sharding.placement={placement}", *variant)
        check(rc == 0, f"normuon {placement}: first half failed")
        manifest = json.load(open(os.path.join(run, "checkpoints", "step_00000004", "manifest.json")))
        fc = [t for t in manifest["tensors"] if t["name"] == "h.0.mlp.c_fc.weight"][0]
        check(sum(p["numel"] for p in fc["pieces"].get("v", [])) == fc["shape"][0],
              f"normuon {placement}: the Muon v pieces do not cover the {fc['shape'][0]} rows: {fc['pieces'].get('v')}")
        rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=8", f"sharding.placement={placement}",
                        "training.resume=auto", f"output.export={run}.safetensors", *variant)
        check(rc == 0 and "resumed at step 4" in out, f"normuon {placement}: resume failed ({rc})")
        if rc == 0:
            same_as(ref, run, f"normuon {placement} resume")
        rc, out = ckpt_tool(bin_dir, "verify", os.path.join(run, "checkpoints", "step_00000008"))
        check(rc == 0 and "all checksums match" in out, f"normuon {placement}: verify: {rc} {out[-300:]}")
    # world 2 -> world 1 with the same global batch (grad_accum 2)
    ref, save = os.path.join(tmp, "nfull_matrixfsdp"), os.path.join(tmp, "nsplit_matrixfsdp")
    run = os.path.join(tmp, "nto1")
    rc, out = train(bin_dir, 1, f"logging.run_dir={run}", "training.steps=8", "training.grad_accum=2",
                    f"training.resume={os.path.join(save, 'checkpoints', 'step_00000004')}",
                    f"output.export={run}.safetensors", *variant)
    check(rc == 0, f"normuon world 2 -> 1 failed ({rc})")
    if rc == 0:
        same_as(ref, run, "normuon world 2 -> world 1", compare_losses=False)
    # a checkpoint without the per-row state cannot continue a NorMuon run
    plain = os.path.join(tmp, "plain")
    rc, _ = train(bin_dir, 2, f"logging.run_dir={plain}", "training.steps=2")
    check(rc == 0, "plain run failed")
    rc, out = train(bin_dir, 2, f"logging.run_dir={os.path.join(tmp, 'mixed')}", "training.steps=4",
                    f"training.resume={os.path.join(plain, 'checkpoints', 'step_00000002')}", *variant, expect=None)
    check(rc == 2 and "NorMuon per-row state" in out, f"muon checkpoint into a normuon run: {rc} {out[-400:]}")


def ckpt_tool(bin_dir, *args):
    p = subprocess.run([os.path.join(bin_dir, "mfsdp-ckpt"), *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def tensors_of(path):
    n, h = safetensors_header(path)
    data = read(path)[8 + n:]
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}


def case_tool(bin_dir, tmp):
    """mfsdp-ckpt list / verify / export / diff."""
    ref = full_run(bin_dir, tmp, "ref", 2, 6, "checkpoint.interval=3")
    ck = os.path.join(ref, "checkpoints")
    os.makedirs(os.path.join(ck, "step_00000009.tmp"))
    rc, out = ckpt_tool(bin_dir, "list", ck)
    check(rc == 0 and re.search(r"step_00000003 +3 +2 matrixfsdp", out) and re.search(r"step_00000006 +6", out)
          and "step_00000009.tmp" in out and "incomplete" in out, f"list: {out}")
    last = os.path.join(ck, "step_00000006")
    rc, out = ckpt_tool(bin_dir, "verify", last)
    check(rc == 0 and "all checksums match" in out, f"verify of a good checkpoint: {rc} {out}")
    bad = os.path.join(tmp, "bad")
    shutil.copytree(last, bad)
    p = os.path.join(bad, "rank_00000.safetensors")
    b = bytearray(read(p))
    b[-5] ^= 1
    open(p, "wb").write(bytes(b))
    rc, out = ckpt_tool(bin_dir, "verify", bad)
    check(rc == 1 and "checksum" in out and "rank_00000.safetensors" in out, f"verify of a damaged checkpoint: {rc} {out}")
    out_file = os.path.join(tmp, "from_ckpt.safetensors")
    rc, out = ckpt_tool(bin_dir, "export", last, out_file)
    check(rc == 0 and tensors_of(out_file) == tensors_of(ref + ".safetensors"),
          f"export of the final checkpoint differs from the training export: {out}")
    rc, out = ckpt_tool(bin_dir, "export", last, os.path.join(last, "manifest.json"))
    check(rc == 2 and "inside the checkpoint" in out and os.path.getsize(os.path.join(last, "manifest.json")) > 100,
          f"export into the checkpoint itself: {rc} {out}")
    # an existing file is replaced only when it is an export (the one above); anything else stays as it was
    rc, out = ckpt_tool(bin_dir, "export", last, out_file)
    check(rc == 0 and tensors_of(out_file) == tensors_of(ref + ".safetensors"), f"export over an earlier export: {rc} {out}")
    mine = os.path.join(tmp, "mine.safetensors")
    shutil.copy(os.path.join(last, "rank_00000.safetensors"), mine)  # safetensors, but no export
    before = read(mine)
    rc, out = ckpt_tool(bin_dir, "export", last, mine)
    check(rc == 2 and f"{mine} was not written by mfsdp-train as an export's weights" in out and read(mine) == before,
          f"export over a safetensors file that is no export: {rc} {out}")
    rc, out = ckpt_tool(bin_dir, "diff", last, last)
    check(rc == 0 and "identical (bitwise)" in out, f"diff of a checkpoint with itself: {out}")
    rc, out = ckpt_tool(bin_dir, "diff", os.path.join(ck, "step_00000003"), last)
    check(rc == 1 and "differ" in out, f"diff of two steps: {rc} {out[-300:]}")


def case_reshard(bin_dir, tmp):
    # B = 1, 12 sequences per step: world 4 x grad_accum 3 saves; every continuation keeps 12.
    # A constant schedule, so the 4-step save run is the first half of the 8-step runs.
    one = ["training.micro_batch_size=1", "schedule.decay=constant"]
    ref = full_run(bin_dir, tmp, "w4", 4, 8, "training.grad_accum=3", *one)
    save = os.path.join(tmp, "save4")
    rc, _ = train(bin_dir, 4, f"logging.run_dir={save}", "training.steps=4", "training.grad_accum=3", *one)
    check(rc == 0, "world-4 save run failed")
    ckpt = os.path.join(save, "checkpoints", "step_00000004")
    for np, accum, placement in [(1, 12, "matrixfsdp"), (2, 6, "fsdp2"), (3, 4, "matrixfsdp"), (4, 3, "fsdp2")]:
        run = os.path.join(tmp, f"to{np}_{placement}")
        rc, out = train(bin_dir, np, f"logging.run_dir={run}", "training.steps=8", f"training.grad_accum={accum}",
                        f"sharding.placement={placement}", f"training.resume={ckpt}", f"output.export={run}.safetensors",
                        *one)
        check(rc == 0, f"resume at world {np} ({placement}) failed ({rc})")
        if rc == 0:
            same_as(ref, run, f"world 4 -> world {np} {placement}")
            rc, out = ckpt_tool(bin_dir, "diff", os.path.join(ref, "checkpoints", "step_00000008"),
                                os.path.join(run, "checkpoints", "step_00000008"))
            check(rc == 0 and "identical (bitwise)" in out, f"world 4 -> world {np}: final checkpoints differ: {out[-500:]}")
    # zero1 and ddp are exact for one micro-batch per rank: B = 3, world 4, grad_accum 1
    three = ["training.micro_batch_size=3", "schedule.decay=constant"]
    ref = full_run(bin_dir, tmp, "w4b3", 4, 8, *three)
    save = os.path.join(tmp, "save4b3")
    rc, _ = train(bin_dir, 4, f"logging.run_dir={save}", "training.steps=4", *three)
    check(rc == 0, "world-4 B=3 save run failed")
    for np, accum, placement in [(4, 1, "zero1"), (4, 1, "ddp"), (2, 2, "matrixfsdp")]:
        run = os.path.join(tmp, f"b3to{np}_{placement}")
        rc, _ = train(bin_dir, np, f"logging.run_dir={run}", "training.steps=8", f"training.grad_accum={accum}",
                      f"sharding.placement={placement}", f"output.export={run}.safetensors",
                      f"training.resume={os.path.join(save, 'checkpoints', 'step_00000004')}", *three)
        check(rc == 0, f"B=3 resume at world {np} ({placement}) failed ({rc})")
        if rc == 0:
            same_as(ref, run, f"B=3 world 4 -> world {np} {placement}")


def case_crash(bin_dir, tmp):
    ref = full_run(bin_dir, tmp, "full", 2, 8)
    run = os.path.join(tmp, "crash")
    save_fault_run(sys.argv[3], run, 6)
    ck = os.path.join(run, "checkpoints")
    check(os.path.isfile(os.path.join(ck, "step_00000003", "manifest.json")), "the step-3 checkpoint is gone")
    check(os.path.isdir(os.path.join(ck, "step_00000006.tmp")) and not os.path.exists(os.path.join(ck, "step_00000006")),
          "the interrupted step-6 save should be left as step_00000006.tmp only")
    before = tree_digest(os.path.join(ck, "step_00000003"))
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=8", "training.resume=auto",
                    f"output.export={run}.safetensors")
    check(rc == 0 and "resumed at step 3" in out, f"resume auto after a crashed save failed ({rc})")
    check("ignoring the incomplete checkpoint" in out and "step_00000006.tmp" in out,
          "no warning about the incomplete checkpoint")
    check("removed" in out and not os.path.exists(os.path.join(ck, "step_00000006.tmp")),
          "the interrupted save's directory was not cleaned up at the next start")
    if rc == 0:
        same_as(ref, run, "resume after a crashed save")
        check(tree_digest(os.path.join(ck, "step_00000003")) == before or not os.path.exists(os.path.join(ck, "step_00000003")),
              "the step-3 checkpoint was altered")
    # a step directory that lost its manifest, ahead of the newest checkpoint: the save of that step
    # would collide with it after training, so resume=auto refuses it at start-up
    lost = os.path.join(ck, "step_00000010")
    os.makedirs(lost)
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=12", "training.resume=auto", expect=2)
    check(rc == 2 and f"{lost} has no manifest.json" in out and "step      9/" not in out and os.path.isdir(lost),
          f"resume=auto beside a step directory without a manifest: rc {rc}: {out[-600:]}")





def case_temporaries(bin_dir, tmp):
    run = os.path.join(tmp, "run")
    ck = os.path.join(run, "checkpoints")
    user = {os.path.join(run, "config.json.tmp"): "my config draft\n", os.path.join(run, "summary.json.tmp"): "mine\n",
            os.path.join(ck, "latest.tmp"): "my pointer\n", os.path.join(ck, "step_00000009.tmp", "notes.txt"): "notes\n"}
    ours = [os.path.join(run, ".config.json.tmp-12-0123456789abcdef"), os.path.join(ck, ".latest.tmp-7-fedcba9876543210"),
            os.path.join(ck, "step_00000008.tmp", ".rank_00001.safetensors.tmp-3-00112233445566aa")]
    for path, text in list(user.items()) + [(p, "stale") for p in ours]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=4", "checkpoint.interval=2")
    check(rc == 0, f"run beside the user's .tmp files: exit {rc}: {out[-600:]}")
    for path, text in user.items():
        check(os.path.exists(path) and read(path) == text.encode(), f"{path} (the user's) was changed or removed")
    for path in ours:
        check(not os.path.exists(path), f"{path} (a stale temporary of the trainer's) was not removed")
    check(not os.path.exists(os.path.join(ck, "step_00000008.tmp")), "the partial step_00000008.tmp was not removed")
    check("keeping" in out and "step_00000009.tmp" in out and "notes.txt" in out, "no warning about the kept directory")
    check(newest_checkpoint(ck) == 4, f"checkpoints of the run: {sorted(os.listdir(ck))}")
    # a save whose temporary directory is a user's directory stops, naming it, and leaves it
    run2 = os.path.join(tmp, "run2")
    mine = os.path.join(run2, "checkpoints", "step_00000002.tmp", "data.csv")
    os.makedirs(os.path.dirname(mine))
    with open(mine, "w") as f:
        f.write("1,2,3\n")
    rc, out = train(bin_dir, 2, f"logging.run_dir={run2}", "training.steps=4", "checkpoint.interval=2", expect=None)
    check(rc != 0 and "step_00000002.tmp holds data.csv" in out and "not a partial checkpoint" in out,
          f"save into a user's step_00000002.tmp: exit {rc}: {out[-600:]}")
    check(read(mine) == b"1,2,3\n", "the user's directory was changed")


def case_corrupt(bin_dir, tmp):
    good_run = os.path.join(tmp, "good")
    rc, _ = train(bin_dir, 2, f"logging.run_dir={good_run}", "training.steps=2", "checkpoint.interval=1")
    check(rc == 0, "could not make a checkpoint")
    good = os.path.join(good_run, "checkpoints", "step_00000002")
    manifest = json.load(open(os.path.join(good, "manifest.json")))

    def edit_manifest(fn):
        def apply(d):
            m = json.loads(json.dumps(manifest))
            fn(m)
            write_sealed(os.path.join(d, "manifest.json"), m)
        return apply

    def write(name, data):
        def apply(d):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        return apply

    def flip_data_byte(d):
        p = os.path.join(d, "rank_00001.safetensors")
        b = bytearray(read(p))
        n, _ = safetensors_header(p)
        b[8 + n + 40] ^= 0x10
        open(p, "wb").write(bytes(b))

    def write_then_seal(data):
        def apply(d):
            with open(os.path.join(d, "manifest.json"), "wb") as f:
                f.write(data)
            seal(os.path.join(d, "manifest.json"))
        return apply

    def first_tensor(m):
        return m["tensors"][0]

    cases = [
        ("missing rank file", lambda d: os.remove(os.path.join(d, "rank_00001.safetensors")), "rank_00001.safetensors"),
        ("truncated rank file", lambda d: open(os.path.join(d, "rank_00000.safetensors"), "r+b").truncate(1000),
         "rank_00000.safetensors"),
        ("flipped byte", flip_data_byte, "checksum"),
        ("missing manifest", lambda d: os.remove(os.path.join(d, "manifest.json")), "manifest.json"),
        ("garbled manifest", write("manifest.json", b'{"format": "matrixfsdp-checkpoint", "step": 2,'), "manifest_xxh3"),
        ("deeply nested manifest", write("manifest.json", b"[" * 100000 + b"]" * 100000), "manifest_xxh3"),
        ("sealed garbled manifest", write_then_seal(b'{\n "format": "matrixfsdp-checkpoint", "step": 2,'), "not valid JSON"),
        ("sealed deeply nested manifest", write_then_seal(b"{\n" + b"[" * 100000 + b"]" * 100000 + b"}"), "nested deeper"),
        ("another model", edit_manifest(lambda m: first_tensor(m).__setitem__("shape", first_tensor(m)["shape"][::-1])),
         "has shape"),
        ("wrong format version", edit_manifest(lambda m: m.__setitem__("format_version", 99)), "format_version"),
        ("wrong dtype", edit_manifest(lambda m: first_tensor(m).__setitem__("dtype", "F16")), "dtype"),
        ("pieces do not tile", edit_manifest(lambda m: first_tensor(m)["pieces"]["param"][0].__setitem__("offset", 1)),
         "tile"),
        ("renamed piece key", edit_manifest(lambda m: first_tensor(m)["pieces"]["param"][0].__setitem__("key", "nope")),
         "missing tensor"),
        ("optimizer kind changed", edit_manifest(
            lambda m: [t.__setitem__("optimizer", "adamw") for t in m["tensors"] if t["optimizer"] == "muon"][:1]),
         "pieces.v"),
        ("piece outside the directory", edit_manifest(
            lambda m: first_tensor(m)["pieces"]["param"][0].__setitem__("file", "../x.safetensors")), "file name"),
        ("negative step", edit_manifest(lambda m: m.__setitem__("step", -5)), "step"),
        ("step of another directory", edit_manifest(lambda m: m.__setitem__("step", 7)), "does not match the directory"),
        ("edited optimizer step count", edit_manifest(lambda m: m.__setitem__("optimizer_steps", 5)), "optimizer_steps"),
        ("edited step and optimizer step count", edit_manifest(
            lambda m: [m.__setitem__(k, 5) for k in ("step", "optimizer_steps")]), "fingerprint"),
        ("unknown placement", edit_manifest(lambda m: m.__setitem__("placement", "bogus")), "placement"),
    ]
    for name, damage, expect in cases:
        d = os.path.join(tmp, "bad_" + re.sub(r"\W+", "_", name))
        if name == "step of another directory":  # keeps its step_N name, so the name can be checked
            d = os.path.join(d, os.path.basename(good))
        shutil.copytree(good, d)
        damage(d)
        before = tree_digest(d)
        run = os.path.join(tmp, "run_" + re.sub(r"\W+", "_", name))
        rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=4", f"training.resume={d}", expect=None)
        check(rc == 2, f"{name}: exit {rc}, expected 2")
        check(expect in out, f"{name}: message lacks '{expect}': {out[-600:]}")
        check(d in out, f"{name}: message does not name the checkpoint directory")
        check("step      1/" not in out, f"{name}: training started")
        check(tree_digest(d) == before, f"{name}: the checkpoint was modified")
        rank_lines = [l for l in out.splitlines() if l.startswith("mfsdp-train: error")]
        check(len(rank_lines) >= 2 or name == "missing manifest",
              f"{name}: expected the error on every rank, got {rank_lines}")
    # a latest pointer that lags (a job died between the rename and the pointer update) or names a
    # missing directory: auto takes the newest complete checkpoint, saying so
    for target in ("step_00000001", "step_00009999"):
        run = os.path.join(tmp, "latest_" + target)
        shutil.copytree(good_run, run)
        with open(os.path.join(run, "checkpoints", "latest"), "w") as f:
            f.write(target + "\n")
        rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=3", "training.resume=auto")
        check(rc == 0 and target in out and "resumed at step 2" in out,
              f"latest -> {target}: expected a warning and a resume from step 2 ({rc})")
    # a checkpoint directory that is a file
    blocker = os.path.join(tmp, "blocker")
    open(blocker, "w").write("not a directory")
    rc, out = train(bin_dir, 2, f"logging.run_dir={os.path.join(tmp, 'r_blocked')}", f"checkpoint.dir={blocker}",
                    "training.steps=2", expect=None)
    check(rc == 2 and "checkpoint.dir" in out, f"checkpoint.dir that is a file: exit {rc}, expected 2")


def seal(path):
    """Re-seals an edited manifest.json (its checksum line) with test_seal_manifest."""
    p = subprocess.run([sys.argv[4], path], capture_output=True, text=True)
    check(p.returncode == 0, f"test_seal_manifest {path}: {p.stderr}")


def write_sealed(path, m):
    """Writes manifest dict `m` as the body of manifest.json (without its checksum line) and seals it."""
    m = dict(m)
    m.pop("manifest_xxh3", None)
    with open(path, "w") as f:
        json.dump(m, f, indent=1)
    seal(path)


def refused_everywhere(out, expect, what):
    """Every rank's error line names `expect`."""
    lines = [l for l in out.splitlines() if l.startswith("mfsdp-train: error")]
    check(len(lines) == 2 and all(expect in l for l in lines), f"{what}: not refused on both ranks naming '{expect}': {lines}")


def case_manifest(bin_dir, tmp):
    good_run = os.path.join(tmp, "good")
    rc, _ = train(bin_dir, 2, f"logging.run_dir={good_run}", "training.steps=2")
    check(rc == 0, "could not make a checkpoint")
    good = os.path.join(good_run, "checkpoints", "step_00000002")
    text = read(os.path.join(good, "manifest.json")).decode()
    check(text.startswith('{\n "manifest_xxh3": "'), f"the manifest does not begin with its checksum: {text[:60]!r}")
    rc, out = ckpt_tool(bin_dir, "verify", good)
    check(rc == 0 and "all checks pass" in out, f"verify of a good checkpoint: {rc} {out[-300:]}")
    manifest = json.loads(text)
    g = manifest["loader"]["global_batch_tokens"]

    def raw(old, new):  # the bytes edited, the checksum line kept
        def apply(d):
            p = os.path.join(d, "manifest.json")
            t = read(p).decode()
            check(old in t, f"'{old}' not in the manifest")
            open(p, "w").write(t.replace(old, new, 1))
        return apply

    def sealed(fn):
        def apply(d):
            m = json.loads(json.dumps(manifest))
            fn(m)
            write_sealed(os.path.join(d, "manifest.json"), m)
        return apply

    def loader(key, value):
        return sealed(lambda m: m["loader"].__setitem__(key, value))

    cases = [  # name, directory name, damage, expected text (resume and verify)
        ("edited loader batch", "step_00000002", raw('"batch": ' + str(manifest["loader"]["batch"]), '"batch": 1'),
         "manifest_xxh3"),
        ("edited step byte", "step_00000002", raw('"step": 2,', '"step": 3,'), "does not match the manifest's content"),
        ("edited global batch", "step_00000002", raw(f'"global_batch_tokens": {g}', f'"global_batch_tokens": {g // 2}'),
         "manifest_xxh3"),
        ("sealed loader batch past the shard", "step_00000002", loader("batch", 10 ** 6), "manifest.json: loader"),
        ("sealed loader shard outside the data", "step_00000002", loader("shard", 7), "does not fit"),
        ("sealed global batch", "step_00000002", loader("global_batch_tokens", g // 2), "loader.global_batch_tokens"),
        ("sealed step", "step_00000002", sealed(lambda m: m.__setitem__("step", 3)), "does not match the directory"),
        ("sealed step, short name", "step_2", sealed(lambda m: m.__setitem__("step", 3)), "does not match the directory"),
        ("sealed step, other name", "backup", sealed(lambda m: m.__setitem__("step", 3)), "optimizer_steps"),
        ("sealed step and optimizer_steps, other name", "backup",
         sealed(lambda m: [m.__setitem__(k, 3) for k in ("step", "optimizer_steps")]), "fingerprint"),
        # checked as 64-bit values: 2^32 + 2 would pass as world size 2 once cast to int
        ("sealed world_size 2^40", "step_00000002", sealed(lambda m: m.__setitem__("world_size", 1 << 40)),
         "world_size: 1099511627776 is larger than 2^24"),
        ("sealed world_size 2^32+2", "step_00000002", sealed(lambda m: m.__setitem__("world_size", (1 << 32) + 2)),
         "world_size: 4294967298 is larger than 2^24"),
    ]
    for name, dir_name, damage, expect in cases:
        d = os.path.join(tmp, re.sub(r"\W+", "_", name), dir_name)
        shutil.copytree(good, d)
        damage(d)
        run = os.path.join(tmp, "run_" + re.sub(r"\W+", "_", name))
        rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=4", f"training.resume={d}", expect=None)
        check(rc == 2, f"{name}: resume exit {rc}, expected 2: {out[-600:]}")
        refused_everywhere(out, expect, name)
        check("step      1/" not in out and "step      3/" not in out, f"{name}: training started")
        rc, vout = ckpt_tool(bin_dir, "verify", d)
        check(rc != 0 and expect in vout, f"{name}: verify exit {rc}, expected a refusal naming '{expect}': {vout[-600:]}")
        if expect == "fingerprint":  # the export checks the state as resume and verify do
            exported = os.path.join(tmp, re.sub(r"\W+", "_", name) + ".safetensors")
            rc, eout = ckpt_tool(bin_dir, "export", d, exported)
            check(rc == 2 and "not exported" in eout and "fingerprint" in eout and not os.path.exists(exported),
                  f"{name}: export exit {rc}, expected a refusal naming the fingerprint: {eout[-600:]}")
    # the same checkpoint under another directory name, unedited, resumes (the step comes from the manifest)
    d = os.path.join(tmp, "renamed", "backup")
    shutil.copytree(good, d)
    rc, out = train(bin_dir, 2, f"logging.run_dir={os.path.join(tmp, 'run_renamed')}", "training.steps=3",
                    f"training.resume={d}")
    check(rc == 0 and "resumed at step 2" in out, f"a renamed, unedited checkpoint did not resume: {rc} {out[-600:]}")


def write_shard(path, tokens):
    """An llm.c uint16 token shard (magic 20240520, version 1)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def shard_tokens(path):
    b = read(path)
    n = struct.unpack("<3i", b[:12])[2]
    return list(struct.unpack(f"<{n}H", b[1024:1024 + 2 * n]))


def case_data(bin_dir, tmp):
    src = shard_tokens(os.path.join(os.path.dirname(TINY), "..", "data", "tiny_shakespeare_char_train.bin"))
    half = len(src) // 2
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    a, b = os.path.join(data, "train_000.bin"), os.path.join(data, "train_001.bin")
    write_shard(a, src[:half])
    write_shard(b, src[half:2 * half])  # the same size as a
    glob = f"data.train={os.path.join(data, 'train_*.bin')}"
    ref = full_run(bin_dir, tmp, "ref", 2, 4, glob)
    run = os.path.join(tmp, "run")
    rc, _ = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=2", glob)
    check(rc == 0, "could not make a checkpoint")
    ckpt = os.path.join(run, "checkpoints", "step_00000002")
    recorded = json.loads(read(os.path.join(ckpt, "manifest.json")))["data"]
    check([e["file"] for e in recorded["train"]] == [a, b] and
          all(re.fullmatch(r"\d+ bytes, whole-file xxh3 [0-9a-f]{16}", e["fingerprint"]) for e in recorded["train"]),
          f"the manifest's data.train: {recorded['train']}")
    originals = {a: read(a), b: read(b)}

    def refused(what, named):
        rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=4", "training.resume=auto", glob,
                        f"output.export={run}.safetensors", expect=None)
        check(rc == 2, f"{what}: resume exit {rc}, expected 2: {out[-600:]}")
        refused_everywhere(out, named, what)
        check("model.init_from" in out and "manifest.json" in out, f"{what}: the message does not say how to go on")
        check("step      3/" not in out, f"{what}: training started")
        rc, vout = ckpt_tool(bin_dir, "verify", ckpt)
        check(rc != 0 and named in vout, f"{what}: verify exit {rc}, expected a refusal naming {named}: {vout[-600:]}")

    open(a, "wb").write(originals[b])  # the two shards swapped
    open(b, "wb").write(originals[a])
    refused("swapped shards", a)
    open(a, "wb").write(originals[a])
    write_shard(b, list(reversed(src[half:2 * half])))  # other tokens, the same size
    refused("rewritten shard", b)
    open(b, "wb").write(originals[b])
    # verify against another run's config: its data.train is checked instead of the saved one
    rc, vout = ckpt_tool(bin_dir, "verify", ckpt, "--config", TINY, "--set", f"data.train={a}")
    check(rc != 0 and "data.train names 1 file(s)" in vout, f"verify --config with other data: {rc} {vout[-600:]}")
    # the unchanged data resumes, bitwise equal to the uninterrupted run
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", "training.steps=4", "training.resume=auto", glob,
                    f"output.export={run}.safetensors")
    check(rc == 0 and "resumed at step 2" in out, f"unchanged data did not resume: {rc} {out[-600:]}")
    same_as(ref, run, "resumed on unchanged data", compare_losses=False)
    # a manifest without "data" (an older build's) resumes, saying the data is not checked
    old = os.path.join(tmp, "old", "step_00000002")
    shutil.copytree(ckpt, old)
    m = json.loads(read(os.path.join(old, "manifest.json")))
    del m["data"]
    write_sealed(os.path.join(old, "manifest.json"), m)
    rc, out = train(bin_dir, 2, f"logging.run_dir={os.path.join(tmp, 'run_old')}", "training.steps=3",
                    f"training.resume={old}", glob)
    check(rc == 0 and "records no fingerprints of the data files" in out,
          f"a manifest without data fingerprints: {rc} {out[-600:]}")
    rc, vout = ckpt_tool(bin_dir, "verify", old)
    check(rc == 0 and "notice:" in vout, f"verify of a manifest without data fingerprints: {rc} {vout[-600:]}")


def case_lock(bin_dir, tmp):
    shared = os.path.join(tmp, "shared_checkpoints")
    first_run, second_run = os.path.join(tmp, "first"), os.path.join(tmp, "second")
    steps = 400  # each step sleeps 50 ms (FAULT_BIN --slow-step): the first job lives for 20 s or more
    first_cmd = command(bin_dir, 2, [f"logging.run_dir={first_run}", f"checkpoint.dir={shared}",
                                     f"training.steps={steps}", "logging.interval=100", "checkpoint.interval=200"])
    first_cmd[4:5] = [sys.argv[3], "--slow-step", "0.05"]
    first, out1 = start_training(first_cmd)  # it holds the lock from its start; wait until it trains
    rc, out = train(bin_dir, 2, f"logging.run_dir={second_run}", f"checkpoint.dir={shared}", "training.steps=10",
                    "training.resume=auto", expect=None)
    check(rc == 2, f"second job on the same checkpoint.dir: exit {rc}, expected 2: {out[-800:]}")
    refused_everywhere(out, "in use by another mfsdp-train job", "second job")
    refused_everywhere(out, f"run directory {first_run}", "second job")
    check("resumed" not in out and "step      1/" not in out, f"the second job started: {out[-500:]}")
    check(first.poll() is None, "the first job ended before the second was refused; make it longer")
    out1 += first.communicate(timeout=600)[0]
    check(first.returncode == 0 and "done:" in out1, f"the first job did not finish cleanly: {out1[-800:]}")
    check(newest_checkpoint(shared) == steps, f"the first job's last checkpoint is missing: {os.listdir(shared)}")
    rc, vout = ckpt_tool(bin_dir, "verify", os.path.join(shared, f"step_{steps:08d}"))
    check(rc == 0, f"the first job's checkpoint does not verify: {vout[-400:]}")
    check(not os.path.exists(os.path.join(second_run, "metrics.jsonl")), "the refused job wrote metrics")
    # the lock file stays behind; with its holder gone it blocks nobody
    check(os.path.isfile(os.path.join(shared, ".mfsdp-checkpoint.lock")), "no lock file in the checkpoint directory")
    rc, out = train(bin_dir, 2, f"logging.run_dir={second_run}", f"checkpoint.dir={shared}",
                    f"training.steps={steps + 2}", "training.resume=auto")
    check(rc == 0 and f"resumed at step {steps}" in out, f"a job after the first one ended: {rc} {out[-600:]}")


def case_full_disk(bin_dir, tmp):
    """A checkpoint directory on a full filesystem: the run fails naming the file; the complete
    checkpoints stay as they were and no partial directory is left."""
    mnt = os.path.join(tmp, "small")
    os.makedirs(mnt)
    if (mounted := mount_small_tmpfs(mnt, "700k")) != 0:
        return 77 if mounted == 77 else None  # a failure is recorded
    try:
        run = os.path.join(tmp, "run")
        # each checkpoint of the tiny model is ~300 KiB: the first fits, the second does not
        rc, out = train(bin_dir, 2, f"logging.run_dir={run}", f"checkpoint.dir={mnt}", "checkpoint.interval=2",
                        "checkpoint.keep_last=0", "training.steps=6", expect=None)
        check(rc != 0, "a run whose checkpoint cannot be written must fail")
        check(re.search(r"step_0000000\d\.tmp|rank_0000\d\.safetensors|manifest", out) is not None,
              f"the failure does not name the file: {out[-800:]}")
        good = os.path.join(mnt, "step_00000002")
        check(os.path.isfile(os.path.join(good, "manifest.json")), "the first checkpoint is gone")
        rc2, out2 = ckpt_tool(bin_dir, "verify", good)
        check(rc2 == 0, f"the first checkpoint was damaged: {out2}")
        check(not [d for d in os.listdir(mnt) if d.endswith(".tmp")], f"partial directories left: {os.listdir(mnt)}")
    finally:
        subprocess.run(["umount", mnt], capture_output=True)


def case_preempt(bin_dir, tmp):
    steps = 6000  # long enough (about 6 s) for the signal to arrive mid-run through mpirun (up to ~1 s)
    ref = full_run(bin_dir, tmp, "full", 2, steps, "logging.interval=100")
    run = os.path.join(tmp, "preempted")
    p, out = start_training(command(bin_dir, 2, [f"logging.run_dir={run}", f"training.steps={steps}",
                                                 "logging.interval=100"]))
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out += p.communicate(timeout=300)[0]
    m = re.search(r"stopping after step (\d+)", out)
    check(m is not None and "checkpoint saved" in out, f"no preemption checkpoint: {out[-1500:]}")
    if not m:
        return
    stopped = int(m.group(1))
    check(stopped < steps, "the run finished before the signal; make it longer")
    check(os.path.isfile(os.path.join(run, "checkpoints", f"step_{stopped:08d}", "manifest.json")),
          "the preemption checkpoint is incomplete")
    rc, out = train(bin_dir, 2, f"logging.run_dir={run}", f"training.steps={steps}", "logging.interval=100",
                    "training.resume=auto", f"output.export={run}.safetensors")
    check(rc == 0 and f"resumed at step {stopped}" in out, f"resume after preemption failed ({rc})")
    if rc == 0:
        same_as(ref, run, "resume after SIGTERM", compare_losses=False)


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp_ckpt"))
