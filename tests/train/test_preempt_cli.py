#!/usr/bin/env python3
"""Preemption under mpirun and waits for rank 0's I/O (stdlib only).

usage: test_preempt_cli.py BIN_DIR CASE FAULT_BIN   with FAULT_BIN the test_train_faults binary
(tests/train/train_with_faults.cpp) and CASE one of
  notice       steps of 2.5 s (longer than mpirun's 1 s kill delay after a SIGTERM): SIGUSR1, the
               default checkpoint.notice_signal, sent to mpirun stops every rank at the next step
               boundary with a complete checkpoint and exit 75, well before the next step would
               end; mfsdp-train resumes from it; checkpoint.notice_signal=SIGUSR2 does the same
               for SIGUSR2
  slow_export  rank 0 takes 4 s more to write the export than sharding.collective_timeout_s (1 s):
               the other ranks wait with the bound for rank 0's I/O, and the run ends with exit 0,
               the export and summary.json
  slow_save    every checkpoint save takes 2 x 2.5 s longer on rank 0 (after its rank file, after
               the manifest) with sharding.collective_timeout_s 1: the ranks wait with the bound
               for the checkpoint's I/O; exit 0, every checkpoint complete (mfsdp-ckpt verify) and
               summary.json; the same under HSDP (4 ranks, 2 replicas: replica 1 waits for replica 0)
  save_timeout rank 0 takes 80 s more for its checkpoint file than the I/O bound of the save (60 s
               for a tiny checkpoint): the job ends at that bound, and the report names it ("the
               wait for the checkpoint's files ... + 1 s per 8 MiB"), not sharding.collective_timeout_s
  slow_sample  rank 0 takes 3 s more for the end-of-run sample than sharding.collective_timeout_s
               (1 s): exit 0 with the sample printed and summary.json
  phases       every rank sends itself SIGUSR1 every 0.5 ms from inside one phase of step 2 on
               (--notice-during: start-up, forward, backward, optimizer step, validation, a
               checkpoint save), on a model whose matmuls run oneDNN's JIT GEMM kernels: exit 75
               after the expected step, a checkpoint that mfsdp-ckpt verify accepts, and a resume
               to step 6 bitwise equal to an uninterrupted run (export bytes, state fingerprint);
               at -np 2 for every phase, at -np 1 for two
  second_signal  one process (no mpirun): a repeated notice changes nothing and SIGTERM after it
               exits at once with 143 and a line saying so; SIGUSR2, not this run's notice, ends
               the process by its default action
Exit 0 on success, 1 on failure.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

from cli_common import ENV, TINY, check, merged_sets, read, run_case, start_training

BASE = ["training.sample_tokens=0", "training.eval_interval=0", "logging.interval=1"]


def faults_cmd(np, *args, sets=()):
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", sys.argv[3], "--config", TINY, "--threads", "1", *args]
    for s in merged_sets(BASE, sets):
        cmd += ["--set", s]
    return cmd


def notice_run(bin_dir, tmp, name, sig, sets=()):
    """A slow-step run on 2 ranks that gets `sig` at mpirun once step 1 is logged."""
    run = os.path.join(tmp, name)
    p, out = start_training(faults_cmd(2, "--slow-step", "2.5", sets=[f"logging.run_dir={run}", "training.steps=40",
                                                                       *sets]), r"step +1/40")
    t0 = time.time()
    p.send_signal(sig)
    out += p.communicate(timeout=300)[0]
    elapsed = time.time() - t0
    name_of = signal.Signals(sig).name
    m = re.search(name_of + r" received: stopping after step (\d+)", out)
    check(m is not None and "checkpoint saved" in out, f"{name_of}: no notice checkpoint: {out[-1500:]}")
    check(p.returncode == 75, f"{name_of}: mpirun exit {p.returncode}, expected 75 (the ranks' preempted code)")
    # The signal lands inside step 2 (or 3): its end, the save and the exit take at most ~2 steps.
    check(elapsed < 15, f"{name_of}: the job took {elapsed:.1f} s to stop after the signal")
    if not m:
        return run, None
    stopped = int(m.group(1))
    check(1 <= stopped <= 4, f"{name_of}: stopped after step {stopped}, expected the step under way (1..4)")
    ckpt = os.path.join(run, "checkpoints", f"step_{stopped:08d}")
    check(all(os.path.isfile(os.path.join(ckpt, f)) for f in
              ["manifest.json", "rank_00000.safetensors", "rank_00001.safetensors"]),
          f"{name_of}: the checkpoint of step {stopped} is incomplete: {os.listdir(os.path.dirname(ckpt))}")
    return run, stopped


def case_notice(bin_dir, tmp):
    run, stopped = notice_run(bin_dir, tmp, "usr1", signal.SIGUSR1)
    if stopped is not None:
        cmd = ["mpirun", "-np", "2", "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config", TINY,
               "--threads", "1"]
        for s in merged_sets(BASE, [f"logging.run_dir={run}", f"training.steps={stopped + 1}", "training.resume=auto"]):
            cmd += ["--set", s]
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        check(p.returncode == 0 and f"resumed at step {stopped}" in out,
              f"resume after the notice: exit {p.returncode}: {out[-1000:]}")
    notice_run(bin_dir, tmp, "usr2", signal.SIGUSR2, sets=["checkpoint.notice_signal=SIGUSR2"])


def case_slow_export(bin_dir, tmp):
    run = os.path.join(tmp, "run")
    model = os.path.join(tmp, "model.safetensors")
    t0 = time.time()
    p = subprocess.run(faults_cmd(2, "--slow-export", "4", sets=[f"logging.run_dir={run}", "training.steps=2",
                                                                 "sharding.collective_timeout_s=1",
                                                                 f"output.export={model}"]),
                       env=ENV, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    check("[export fault] rank 0 sleeps 4" in out, f"the export was not slowed: {out[-800:]}")
    check(p.returncode == 0 and "timed out" not in out, f"slow export: exit {p.returncode}: {out[-1500:]}")
    check(time.time() - t0 > 4, "the run did not wait for the slow export")
    check(os.path.isfile(model), "no export")
    summary = os.path.join(run, "summary.json")
    check(os.path.isfile(summary), "no summary.json after a slow export")
    if os.path.isfile(summary):
        with open(summary) as f:
            check(json.load(f)["steps"] == 2, "summary.json: steps != 2")


def finished(run, out, rc, steps, what):
    """The run ended with exit 0, no timeout and a summary.json of `steps` steps."""
    check(rc == 0 and "timed out" not in out, f"{what}: exit {rc}: {out[-1500:]}")
    summary = os.path.join(run, "summary.json")
    check(os.path.isfile(summary), f"{what}: no summary.json")
    if os.path.isfile(summary):
        with open(summary) as f:
            check(json.load(f)["steps"] == steps, f"{what}: summary.json: steps != {steps}")


def case_slow_save(bin_dir, tmp):
    for np, sets in [(2, []), (4, ["sharding.replicate=2"])]:
        run = os.path.join(tmp, f"run_np{np}")
        t0 = time.time()
        p = subprocess.run(faults_cmd(np, "--slow-save", "2.5", sets=[f"logging.run_dir={run}", "training.steps=2",
                                                                     "checkpoint.interval=1",
                                                                     "sharding.collective_timeout_s=1", *sets]),
                           env=ENV, capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        what = f"slow save on {np} ranks"
        check(out.count("[save fault] rank 0 sleeps 2.5 s after publishing") == 2, f"{what}: the saves were not slowed")
        check(time.time() - t0 > 10, f"{what}: the run did not wait for the slow saves")
        finished(run, out, p.returncode, 2, what)
        for step in (1, 2):
            ckpt = os.path.join(run, "checkpoints", f"step_{step:08d}")
            v = subprocess.run([os.path.join(bin_dir, "mfsdp-ckpt"), "verify", ckpt], env=ENV, capture_output=True,
                               text=True, timeout=300)
            check(v.returncode == 0, f"{what}: checkpoint {step} does not verify: {v.stdout[-600:]}{v.stderr[-600:]}")


def case_save_timeout(bin_dir, tmp):
    run = os.path.join(tmp, "run")
    t0 = time.time()
    p = subprocess.run(faults_cmd(2, "--slow-save", "80", sets=[f"logging.run_dir={run}", "training.steps=1",
                                                                "sharding.collective_timeout_s=1"]),
                       env=ENV, capture_output=True, text=True, timeout=300)
    out, elapsed = p.stdout + p.stderr, time.time() - t0
    m = re.search(r"timed out after ([0-9.]+) s \(the wait for the checkpoint's files, at most [^)]* written by the "
                  r"ranks: max\(sharding.collective_timeout_s, 60 s\) \+ 1 s per 8 MiB", out)
    check(p.returncode != 0 and m is not None, f"no timeout report naming the save's I/O bound: exit {p.returncode}: "
                                               f"{out[-1500:]}")
    check(m is None or 60 <= float(m.group(1)) < 75, f"the I/O bound fired after {m and m.group(1)} s, expected 60")
    check(elapsed < 78, f"the job took {elapsed:.0f} s: it waited for the slow rank instead of the bound")
    check(not os.path.isfile(os.path.join(run, "summary.json")), "summary.json after a timed-out save")


def case_slow_sample(bin_dir, tmp):
    run = os.path.join(tmp, "run")
    t0 = time.time()
    p = subprocess.run(faults_cmd(2, "--slow-sample", "3", sets=[f"logging.run_dir={run}", "training.steps=2",
                                                                 "training.sample_tokens=8",
                                                                 "sharding.collective_timeout_s=1"]),
                       env=ENV, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    check("[sample fault] rank 0 sleeps 3" in out and "---- sample:" in out, f"the sample was not slowed: {out[-800:]}")
    check(time.time() - t0 > 3, "the run did not wait for the slow sample")
    finished(run, out, p.returncode, 2, "slow sample")


# A model whose matmuls and Newton-Schulz bands (256 rows and more) run oneDNN's JIT f32 GEMM.
WIDE = ['model={"n_layer": 2, "n_head": 4, "n_embd": 256}', "training.steps=6", "training.eval_interval=2",
        "training.eval_tokens=2048"]
# --notice-during PHASE -> the step after which the run stops (a notice during the save of step 2
# is seen at the boundary of step 3)
PHASE_STOP = {"startup": 1, "forward": 2, "backward": 2, "optimizer": 2, "eval": 2, "save": 3}


def trainer_cmd(binary, np, sets):
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", binary, "--config", TINY, "--threads", "1"]
    for s in merged_sets(BASE, WIDE, sets):
        cmd += ["--set", s]
    return cmd


def verify(bin_dir, ckpt, what):
    v = subprocess.run([os.path.join(bin_dir, "mfsdp-ckpt"), "verify", ckpt], env=ENV, capture_output=True, text=True,
                       timeout=300)
    check(v.returncode == 0, f"{what}: {ckpt} does not verify: {v.stdout[-600:]}{v.stderr[-600:]}")


def finished_run(bin_dir, np, run, what, sets=()):
    """mfsdp-train to step 6 in `run` (resuming what is there) with an export; its summary."""
    p = subprocess.run(trainer_cmd(os.path.join(bin_dir, "mfsdp-train"), np,
                                   [f"logging.run_dir={run}", "training.resume=auto",
                                    f"output.export={run}.safetensors", *sets]),
                       env=ENV, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    check(p.returncode == 0, f"{what}: exit {p.returncode}: {out[-1500:]}")
    if p.returncode != 0:
        return None
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f)["state_fingerprint"], read(run + ".safetensors")


def case_phases(bin_dir, tmp):
    for np, phases in [(2, list(PHASE_STOP)), (1, ["optimizer", "save"])]:
        reference = finished_run(bin_dir, np, os.path.join(tmp, f"reference_np{np}"), f"uninterrupted run at -np {np}")
        for phase in phases:
            what = f"a notice during {phase} at -np {np}"
            run = os.path.join(tmp, f"{phase}_np{np}")
            sets = [f"logging.run_dir={run}"] + (["checkpoint.interval=2"] if phase == "save" else [])
            p = subprocess.run(trainer_cmd(sys.argv[3], np, sets) + ["--notice-during", phase], env=ENV,
                               capture_output=True, text=True, timeout=300)
            out = p.stdout + p.stderr
            stop = PHASE_STOP[phase]
            check(p.returncode == 75, f"{what}: exit {p.returncode}, expected 75: {out[-2000:]}")
            check(f"SIGUSR1 received: stopping after step {stop}" in out, f"{what}: did not stop after step {stop}: "
                                                                          f"{out[-1500:]}")
            check(phase == "startup" or "storm from now on" in out, f"{what}: no notice was sent")
            verify(bin_dir, os.path.join(run, "checkpoints", f"step_{stop:08d}"), what)
            resumed = finished_run(bin_dir, np, run, f"{what}: the resume")
            check(reference is None or resumed == reference,
                  f"{what}: the resumed run differs from the uninterrupted one (state fingerprint, export bytes)")


def case_second_signal(bin_dir, tmp):
    cmd = [sys.argv[3], "--config", TINY, "--threads", "1", "--slow-step", "2"]
    for s in merged_sets(BASE, ["training.steps=40"]):
        cmd += ["--set", s]
    # a repeated notice, then SIGTERM
    p, out = start_training(cmd + ["--set", f"logging.run_dir={os.path.join(tmp, 'term')}"], r"step +1/40")
    for sig in (signal.SIGUSR1, signal.SIGUSR1, signal.SIGTERM):
        time.sleep(0.2)
        p.send_signal(sig)
    out += p.communicate(timeout=60)[0]
    check(p.returncode == 143, f"SIGTERM after a notice: exit {p.returncode}, expected 143: {out[-1000:]}")
    check("SIGTERM while a stop was pending (SIGUSR1): exiting now" in out, f"SIGTERM after a notice: no report: "
                                                                            f"{out[-1000:]}")
    # SIGUSR2 is not this run's notice: its default action
    p, out = start_training(cmd + ["--set", f"logging.run_dir={os.path.join(tmp, 'usr2')}"], r"step +1/40")
    p.send_signal(signal.SIGUSR2)
    out += p.communicate(timeout=60)[0]
    check(p.returncode == -signal.SIGUSR2, f"SIGUSR2 with notice SIGUSR1: exit {p.returncode}, expected death by "
                                           f"SIGUSR2: {out[-1000:]}")


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp_preempt"))
