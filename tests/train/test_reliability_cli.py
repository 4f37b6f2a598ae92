#!/usr/bin/env python3
"""Failure handling of mfsdp-train under mpirun (stdlib only).

usage: test_reliability_cli.py BIN_DIR CASE   with CASE one of
  disagree    one rank launched with other arguments (flags, a bad option, steps, n_layer, placement, grad_accum,
              eval_interval, muon lr, shuffle, vocab, seed, train data): exit 2 on every rank,
              the differing key and each rank's value named, nothing trained
  hang        one rank stopped (SIGSTOP) mid-run: the collective timeout ends the job with a
              message naming the operation, the phase and the step; one rank that leaves at
              start-up (--help given to it alone): the others stop within the config's
              sharding.collective_timeout_s (3 s), naming the start-up checks
  lock        a second job in a run directory in use is refused; the first finishes
  run_dir     config.json of the user in logging.run_dir, or the config itself there: refused
  full_disk   metrics.jsonl on a full filesystem (a 64 KiB tmpfs): the run fails naming the file;
              skipped (77) where mounting a tmpfs is not permitted, failed where it is
  deep_json   configs and safetensors headers nested 100,000 deep, --set values 60,000: refused (exit 2),
              no crash, in mfsdp-train and mfsdp-plan
Exit 0 on success, 1 on failure, 77 when skipped.
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

from cli_common import ENV, ROOT, TINY, check, mount_small_tmpfs, run_case


def run(cmd, timeout=300, env=None):
    p = subprocess.run(cmd, env=env or ENV, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def mpirun(np, exe, *args):
    return ["mpirun", "-np", str(np), "--oversubscribe", exe, *args]


def case_disagree(bin_dir, tmp):
    train = os.path.join(bin_dir, "mfsdp-train")
    other_data = os.path.join(tmp, "other_train.bin")
    shutil.copy(os.path.join(ROOT, "data", "tiny_shakespeare_char_train.bin"), other_data)
    # (training.steps is set for both ranks below, and a key may be set once: another key differs)
    cases = [("training.micro_batch_size=2", "config.training.micro_batch_size"), ("model.n_layer=3", "config.model.n_layer"),
             ("sharding.placement=fsdp2", "config.sharding.placement"), ("training.grad_accum=2", "config.training.grad_accum"),
             ("training.eval_interval=3", "config.training.eval_interval"), ("optimizer.muon.lr=0.03", "config.optimizer.muon.lr"),
             ("data.shuffle=true", "config.data.shuffle"), ("training.seed=7", "config.training.seed"),
             ("model.vocab_size=66 --set data.tokenizer=", "config.model.vocab_size"), (f"data.train={other_data}", "config.data.train")]
    model = os.path.join(tmp, "model.safetensors")
    rc, out = run(mpirun(2, train, "--config", TINY, "--set", "training.steps=1", "--set", f"output.export={model}",
                         "--set", f"logging.run_dir={os.path.join(tmp, 'm')}", "--set", "training.sample_tokens=0"))
    check(rc == 0, f"could not make a model: {out[-300:]}")
    cases += [(f"--eval-only --set model.init_from={model}", "--eval-only"), ("--bogus-option", "command line"),
              ("--print-config", "--print-config")]
    for override, key in cases:
        wrapper = os.path.join(tmp, "wrap.sh")
        with open(wrapper, "w") as f:
            extra = override if override.startswith("--") else "--set " + override
            f.write("#!/bin/sh\n"
                    f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec {train} "$@" {extra}; fi\n'
                    f'exec {train} "$@"\n')
        os.chmod(wrapper, 0o755)
        t0 = time.time()
        rc, out = run(mpirun(2, wrapper, "--config", TINY, "--threads", "1", "--set", "training.steps=5",
                             "--set", f"logging.run_dir={os.path.join(tmp, 'r')}", "--set", "training.sample_tokens=0"),
                      timeout=120)
        check(rc == 2, f"{override} on rank 1: exit {rc}, expected 2")
        check(key in out and "rank 0" in out and "rank 1" in out, f"{override}: key {key} or the ranks not named: {out[-800:]}")
        check(len(re.findall(r"mfsdp-train: (error \(rank \d\)|rank \d stops)", out)) == 2,
              f"{override}: not reported on every rank: {out[-800:]}")
        check("step      1/" not in out, f"{override}: training started")
        check(time.time() - t0 < 60, f"{override}: took {time.time() - t0:.0f} s")


def case_lock(bin_dir, tmp):
    """A second job in a run directory that a live job uses is refused (exit 2), the first goes on."""
    run_dir = os.path.join(tmp, "shared")
    cmd = mpirun(2, os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, "--threads", "1",
                 "--set", "training.steps=3000", "--set", "logging.interval=500", "--set", f"logging.run_dir={run_dir}",
                 "--set", "training.sample_tokens=0", "--set", "training.eval_interval=0", "--set", "checkpoint.interval=1000")
    first = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out1 = ""
    for line in first.stdout:
        out1 += line
        if re.search(r"step +\d+/", line):
            break
    rc, out = run(cmd)
    check(rc == 2 and "in use by another mfsdp-train job" in out, f"second job: exit {rc}: {out[-500:]}")
    out1 += first.communicate(timeout=300)[0]
    check(first.returncode == 0 and "done:" in out1, f"the first job did not finish cleanly: {out1[-500:]}")


def case_hang(bin_dir, tmp):
    train = os.path.join(bin_dir, "mfsdp-train")
    common = ["--config", TINY, "--threads", "1", "--set", "sharding.collective_timeout_s=3"]
    t0 = time.time()
    rc, out = run(mpirun(1, train, *common, "--set", f"logging.run_dir={os.path.join(tmp, 'early')}") + [":"] +
                  ["-np", "1", train, *common, "--help"], timeout=120)
    elapsed = time.time() - t0
    check(rc != 0 and "timed out after 3 s (sharding.collective_timeout_s" in out and "at the start-up checks" in out,
          f"a rank that left at start-up: exit {rc}, no report naming the start-up checks: {out[-1000:]}")
    check(elapsed < 30, f"a rank that left at start-up: the others took {elapsed:.0f} s to stop (timeout 3 s)")
    stopped_rank(bin_dir, tmp)


def stopped_rank(bin_dir, tmp):
    cmd = mpirun(2, os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, "--threads", "1",
                 "--set", "training.steps=100000", "--set", "sharding.collective_timeout_s=5",
                 "--set", "logging.interval=1000", "--set", f"logging.run_dir={os.path.join(tmp, 'r')}",
                 "--set", "checkpoint.at_end=false", "--set", "training.eval_interval=0")
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    out = ""
    for line in p.stdout:
        out += line
        if re.search(r"step +\d+/", line):
            break
    pids = subprocess.run(["pgrep", "-f", "-P", str(p.pid), "mfsdp-train"], capture_output=True, text=True).stdout.split()
    check(len(pids) == 2, f"expected 2 rank processes, found {pids}")
    if not pids:
        p.kill()
        return
    t0 = time.time()
    os.kill(int(pids[-1]), signal.SIGSTOP)
    try:
        out += p.communicate(timeout=120)[0]
        elapsed = time.time() - t0
        check(p.returncode != 0, "a job with a stopped rank did not fail")
        check(elapsed < 60, f"the job took {elapsed:.0f} s to end (timeout 5 s)")
        check("timed out after 5" in out and re.search(r"at step \d+", out) is not None and "phase" in out,
              f"no timeout message naming operation, phase and step: {out[-1000:]}")
    except subprocess.TimeoutExpired:
        check(False, "the job hangs with a stopped rank")
    finally:
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(int(pid), sig)
                except ProcessLookupError:
                    pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def case_run_dir(bin_dir, tmp):
    train = os.path.join(bin_dir, "mfsdp-train")
    # a user's config.json in the run directory is never overwritten
    rdir = os.path.join(tmp, "user")
    os.makedirs(rdir)
    mine = os.path.join(rdir, "config.json")
    with open(mine, "w") as f:
        f.write("// my notes\n{\"model\": {}}\n")
    rc, out = run(mpirun(2, train, "--config", TINY, "--set", f"logging.run_dir={rdir}"))
    check(rc == 2 and "not written by mfsdp-train" in out, f"a user's config.json: exit {rc}: {out[-500:]}")
    check(open(mine).read() == "// my notes\n{\"model\": {}}\n", "the user's config.json was changed")
    # the config file itself inside its own run directory
    sdir = os.path.join(tmp, "self")
    os.makedirs(sdir)
    cfg = json.load(open(TINY))
    for section in ("data",):
        for k in ("train", "val", "tokenizer_path"):
            cfg[section][k] = os.path.join(ROOT, "configs", cfg[section][k])
    cfg["logging"]["run_dir"] = "."
    text = "// keep this comment\n" + json.dumps(cfg)
    with open(os.path.join(sdir, "config.json"), "w") as f:
        f.write(text)
    rc, out = run(mpirun(2, train, "--config", os.path.join(sdir, "config.json")))
    check(rc == 2 and "is the input config" in out, f"config inside its own run_dir: exit {rc}: {out[-500:]}")
    check(open(os.path.join(sdir, "config.json")).read() == text, "the input config was changed")


def case_full_disk(bin_dir, tmp):
    train = os.path.join(bin_dir, "mfsdp-train")
    # a run directory that fills up: the failure names metrics.jsonl, summary.json is not left empty
    mnt = os.path.join(tmp, "small")
    os.makedirs(mnt)
    if (mounted := mount_small_tmpfs(mnt, "64k")) != 0:
        return 77 if mounted == 77 else None  # a failure is recorded
    try:
        rc, out = run(mpirun(2, train, "--config", TINY, "--threads", "1", "--set", f"logging.run_dir={mnt}",
                             "--set", "training.steps=2000", "--set", "checkpoint.at_end=false",
                             "--set", "training.sample_tokens=0", "--set", "training.eval_interval=0"))
        check(rc != 0, "a run whose metrics cannot be written must fail")
        check("metrics.jsonl" in out and "write failed" in out, f"the full disk is not named: {out[-600:]}")
        summary = os.path.join(mnt, "summary.json")
        check(not os.path.exists(summary) or os.path.getsize(summary) > 0, "an empty summary.json was left")
    finally:
        subprocess.run(["umount", mnt], capture_output=True)


def case_deep_json(bin_dir, tmp):
    deep = "[" * 100000 + "]" * 100000
    bad_cfg = os.path.join(tmp, "deep.json")
    with open(bad_cfg, "w") as f:
        f.write('{"model": {"n_layer": ' + deep + "}}")
    for exe, extra in (("mfsdp-train", []), ("mfsdp-plan", ["--world-size", "2"])):
        rc, out = run([os.path.join(bin_dir, exe), "--config", bad_cfg, *extra])
        check(rc == 2 and "nested deeper" in out, f"{exe}: deep config: exit {rc}: {out[-300:]}")
        if exe == "mfsdp-plan":
            continue  # no --set
        arg_deep = "[" * 60000 + "]" * 60000  # one argument is limited to 128 KiB
        rc, out = run([os.path.join(bin_dir, exe), "--config", TINY, "--set", "model.n_layer=" + arg_deep, *extra])
        check(rc == 2 and "nested deeper" in out, f"{exe}: deep --set value: exit {rc}: {out[-300:]}")
    # a safetensors header with a deeply nested shape, as model.init_from
    header = ('{"wte.weight": {"dtype": "F32", "shape": ' + deep + ', "data_offsets": [0, 4]}}').encode()
    st = os.path.join(tmp, "deep.safetensors")
    with open(st, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")
    rc, out = run(mpirun(2, os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, "--set", f"model.init_from={st}",
                         "--set", f"logging.run_dir={os.path.join(tmp, 'r')}"))
    check(rc == 2 and "nested deeper" in out and st in out, f"deep safetensors header: exit {rc}: {out[-400:]}")


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp_rel"))
