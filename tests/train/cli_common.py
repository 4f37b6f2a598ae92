"""Shared by the mfsdp-train end-to-end drivers in this folder (stdlib only): paths, the MPI
environment, failure bookkeeping, small file readers and the case runner."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "configs", "tiny_test.json")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
failures = []
_case_tmp = None  # the running case's temporary directory (set by run_case)


def check(cond, msg):
    """Records a failure (the case goes on, so one run reports every problem)."""
    if not cond:
        failures.append(msg)
        print("FAILED:", msg)


def start_training(cmd, pattern=r"step +\d+/", timeout=120):
    """Starts `cmd` (an mpirun of a trainer) and returns (process, output so far) once a line
    matches `pattern` (training is under way) or after `timeout` seconds."""
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, deadline = "", time.time() + timeout
    for line in p.stdout:
        out += line
        if re.search(pattern, line) or time.time() > deadline:
            break
    return p, out


def not_permitted(error):
    """Whether a facility's set-up error means it is not permitted here (tests/README.md's skip
    rule: not root, or the kernel says so), rather than broken."""
    e = error.lower()
    return os.geteuid() != 0 or "not permitted" in e or "permission denied" in e


def mount_small_tmpfs(mnt, size):
    """Mounts a tmpfs of `size` (e.g. "64k") at mnt, a full disk for the tests. Returns 0 when
    mounted; 77 (the case skips) where mounting is not permitted; 1 where it is and failed, recorded
    as a test failure (tests/README.md's skip rule)."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mnt], capture_output=True, text=True)
    if r.returncode == 0:
        return 0
    if not_permitted(r.stderr):
        print(f"skipped: mounting a tmpfs is not permitted here ({r.stderr.strip()})")
        return 77
    check(False, f"cannot mount a {size} tmpfs at {mnt} as root: {r.stderr.strip()}")
    return 1


def read(path):
    with open(path, "rb") as f:
        return f.read()


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def safetensors_header(path):
    """(header length, header dict) of a safetensors file."""
    b = read(path)
    n = struct.unpack("<Q", b[:8])[0]
    return n, json.loads(b[8:8 + n])


def fresh_dir(name):
    """A new empty directory under the running case's temporary directory (removed with it)."""
    return tempfile.mkdtemp(prefix=name + "_", dir=_case_tmp)


def merged_sets(*groups):
    """The --set overrides of `groups` in order, a later "key=value" replacing an earlier one of the
    same key (mfsdp-train refuses a key set twice)."""
    out = {}
    for group in groups:
        for s in group:
            key = s.split("=", 1)[0]
            out.pop(key, None)
            out[key] = s
    return list(out.values())


def with_run_dir(sets):
    """`sets` (--set overrides) with logging.run_dir pointing to a fresh directory unless one names
    it: a run never sees another run's outputs or checkpoints (the shipped configs' default run
    directory is shared with whatever ran there before)."""
    if any(s.startswith("logging.run_dir=") for s in sets):
        return list(sets)
    return [*sets, f"logging.run_dir={fresh_dir('run')}"]


def run_trainer(bin_dir, np, config, sets, expect=0):
    """mpirun -np NP mfsdp-train --config CONFIG --threads 1 with `sets` as --set, in a fresh run
    directory unless `sets` names one. Returns (exit code, output, run directory, summary.json or
    None); prints the output's tail when the exit code is not `expect`."""
    sets = with_run_dir(sets)
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config", config,
           "--threads", "1"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode != expect:
        print(out[-4000:])
    run_dir = next(s.split("=", 1)[1] for s in sets if s.startswith("logging.run_dir="))
    summary = None
    if p.returncode == 0:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
    return p.returncode, out, run_dir, summary


def run_case(namespace, prefix):
    """usage: DRIVER BIN_DIR CASE: runs namespace["case_" + CASE](bin_dir, tmp) in a fresh temporary
    directory. Exit 0 on success, 1 on failure, 77 when the case skipped itself."""
    global _case_tmp
    bin_dir, case = sys.argv[1], sys.argv[2]
    tmp = _case_tmp = tempfile.mkdtemp(prefix=f"{prefix}_{case}_")
    try:
        if namespace[f"case_{case}"](bin_dir, tmp) == 77:
            return 77
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{case}: {'FAILED' if failures else 'passed'} ({len(failures)} failures)")
    return 1 if failures else 0
