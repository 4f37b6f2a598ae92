"""mfsdp-train under a real Slurm on emulated nodes (scripts/emulate_cluster.sh up N --slurm: slurmctld,
one slurmd per node, munge, PMIx), driven the way users drive it: srun --mpi=pmix, and the project's
own scripts/train.sbatch submitted unmodified. Stdlib only.

usage: test_slurm_cli.py BIN_DIR CASE
  launch           srun -N2 --ntasks-per-node=2 --mpi=pmix: the topology line names the Slurm nodes and
                   the state fingerprint equals mpirun's on one node; train.sbatch completes and says
                   how to follow and resume the job
  preempt_requeue  scancel --signal=USR1 mid-run: every rank saves and exits 75, the batch script
                   requeues the job, the restarted job resumes and ends with the uninterrupted run's
                   fingerprint
  node_loss        every process of node 1 killed mid-run (slurmd too): Slurm declares the node down,
                   requeues the job (NODE_FAIL), which restarts on node 0 alone at world size 2, resumes
                   the newest checkpoint at the same global batch (training.global_batch_size) and ends
                   with the uninterrupted run's fingerprint
Exit 77 where namespaces are not permitted (tests/README.md's skip rule); as root, a Slurm that
does not come up is a failure."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "train"))
from cli_common import ENV, ROOT, TINY, check, read, run_case, run_trainer  # noqa: E402

EMULATE = os.path.join(ROOT, "scripts", "emulate_cluster.sh")
SBATCH = os.path.join(ROOT, "scripts", "train.sbatch")
STATE = "/run/mfsdp-slurm-test"  # this group's own cluster: a user's default cluster is left alone
# The tiny model at a global batch of 16 sequences (4 per micro-batch): 4 ranks x 1 or 2 ranks x 2.
RUN = ["training.global_batch_size=16", "training.micro_batch_size=4", "training.eval_interval=0",
       "training.sample_tokens=0", "schedule.decay=constant", "logging.interval=10", "data.shuffle=true"]


class NotPermitted(Exception):
    pass


def emulate(*args, timeout=120, env=None):
    r = subprocess.run(["bash", EMULATE, *args], env=dict(ENV, MFSDP_EMULATE_DIR=STATE, **(env or {})),
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if r.returncode == 77:
        raise NotPermitted(r.stderr.strip())
    return r


def slurm(*args, **kw):
    """A Slurm command on node 0 (the login node), from the repository root."""
    return emulate("slurm", *args, **kw)


def job_state(job):
    out = slurm("scontrol", "show", "job", str(job)).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "?"


def wait_for(what, cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.5)
    check(False, f"timed out after {timeout} s waiting for {what}")
    return False


SHARED = []


def shared_dir():
    """A directory every emulated node sees (each node has its own /tmp), removed at the end."""
    SHARED.append(tempfile.mkdtemp(prefix="mfsdp_slurm_", dir="/var/tmp"))
    return SHARED[-1]


def submit(work, steps, *sets):
    """sbatch scripts/train.sbatch (unmodified) with the tiny config; returns (job id, output file)."""
    out = os.path.join(work, "job-%j.out")
    args = ["sbatch", f"--output={out}", SBATCH]
    for s in [*RUN, f"training.steps={steps}", f"logging.run_dir={os.path.join(work, 'run')}", *sets]:
        args += ["--set", s]
    r = emulate("slurm", *args, env={"CONFIG": TINY})  # sbatch passes the environment on
    m = re.search(r"Submitted batch job (\d+)", r.stdout)
    check(r.returncode == 0 and m, f"sbatch: rc {r.returncode}: {r.stdout}{r.stderr}")
    job = int(m.group(1)) if m else 0
    return job, out.replace("%j", str(job))


def text(path):
    return read(path).decode(errors="replace") if os.path.exists(path) else ""


def steps_done(path):
    return [int(x) for x in re.findall(r"^step +(\d+)/", text(path), re.M)]


def fingerprint(run_dir):
    m = re.search(r'"state_fingerprint": "([0-9a-f]+)"', text(os.path.join(run_dir, "summary.json")))
    return m.group(1) if m else None


def reference(bin_dir, steps):
    """The uninterrupted run at the same global batch, on this host (fingerprints do not depend on
    the world size)."""
    rc, out, run_dir, summary = run_trainer(bin_dir, 4, TINY, [*RUN, f"training.steps={steps}", "checkpoint.at_end=false"])
    check(rc == 0, f"the reference run failed: {out[-600:]}")
    return summary["state_fingerprint"] if summary else None


def up(nodes=2):
    r = emulate("up", str(nodes), "--slots", "2", "--slurm")
    check(r.returncode == 0, f"Slurm did not come up: rc {r.returncode}: {r.stderr[-2000:]}")
    return r.returncode == 0


def case_launch(bin_dir, tmp):
    if not up():
        return
    work = shared_dir()
    run = os.path.join(work, "srun")
    r = slurm("srun", "-N2", "--ntasks-per-node=2", "--mpi=pmix", "--kill-on-bad-exit=1",
              os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, "--threads", "1",
              *sum((["--set", s] for s in [*RUN, "training.steps=6", f"logging.run_dir={run}"]), []), timeout=300)
    check(r.returncode == 0 and "topology: 4 rank(s) on 2 node(s), 2 per node: node0 (ranks 0-1), node1 (ranks 2-3)" in r.stdout,
          f"srun: rc {r.returncode}: {r.stdout[-1500:]}{r.stderr[-1500:]}")
    check(fingerprint(run) is not None and fingerprint(run) == reference(bin_dir, 6),
          "srun across 2 nodes x 2 ranks differs from mpirun's 4 ranks on one node")
    job, out = submit(work, 6)
    wait_for(f"job {job} to complete", lambda: job_state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 240)
    log = text(out)
    check(job_state(job) == "COMPLETED" and "follow: tail -f" in log and "resume: sbatch scripts/train.sbatch" in log
          and "done: 6 steps" in log, f"train.sbatch job {job}: {job_state(job)}: {log[-1500:]}")


def case_preempt_requeue(bin_dir, tmp):
    if not up():
        return
    work = shared_dir()
    steps = 3000
    job, out = submit(work, steps)
    wait_for("the job's first steps", lambda: len(steps_done(out)) >= 3, 180)
    t_notice = time.time()
    slurm("scancel", "--signal=USR1", str(job))
    wait_for("the requeued job to start again", lambda: "(restart 1)" in text(out), 120)
    t_running = time.time()
    wait_for(f"job {job} to complete", lambda: job_state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 300)
    log = text(out)
    stopped = re.search(r"preempted after step (\d+); checkpoint saved", log)
    check(stopped and "stopped by a notice after saving; requeueing" in log and "resumed at step" in log
          and job_state(job) == "COMPLETED", f"preemption and requeue of job {job}: {job_state(job)}: {log[-2500:]}")
    if stopped:
        print(f"preempt_requeue: notice -> running again in {t_running - t_notice:.1f} s, stopped after step "
              f"{stopped.group(1)}, steps redone 0")
    check(fingerprint(os.path.join(work, "run")) == reference(bin_dir, steps),
          "the requeued run does not end with the uninterrupted run's fingerprint")


def case_node_loss(bin_dir, tmp):
    if not up():
        return
    work = shared_dir()
    steps = 3000
    job, out = submit(work, steps, "checkpoint.interval=20", "sharding.collective_timeout_s=5")
    wait_for("the job's first checkpoints", lambda: "saved checkpoint" in text(out) and len(steps_done(out)) >= 5, 180)
    t_fault = time.time()
    last_step = max(steps_done(out) or [0])
    emulate("kill", "1")  # every process of node 1, its slurmd included: a dead node to Slurm
    if not wait_for("the job to run again on the nodes that are left", lambda: "(restart 1)" in text(out), 240):
        print(slurm("scontrol", "show", "job", str(job)).stdout, slurm("sinfo", "-N").stdout, text(out)[-3000:])
    t_running = time.time()
    wait_for(f"job {job} to complete", lambda: job_state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 240)
    log = text(out)
    restart = log[log.find("(restart 1)"):]
    resumed = re.search(r"resumed at step (\d+)", restart)
    check("(restart 1) on node0: 2 ranks" in log and "topology: 2 rank(s) on 1 node(s)" in restart and resumed
          and job_state(job) == "COMPLETED", f"node loss of job {job}: {job_state(job)}: {log[-2500:]}")
    if resumed:
        print(f"node_loss: node killed -> running again on node0 in {t_running - t_fault:.1f} s, "
              f"steps redone {last_step - int(resumed.group(1))} (last logged step {last_step}, resumed at "
              f"{resumed.group(1)})")
    check(fingerprint(os.path.join(work, "run")) == reference(bin_dir, steps),
          "the run resumed on fewer nodes does not end with the uninterrupted run's fingerprint")


if __name__ == "__main__":
    code = 1
    try:
        code = run_case(globals(), "slurm")
    except NotPermitted as e:
        print(f"skipped: {e}")
        code = 77
    finally:
        emulate("down")
        for d in SHARED:
            shutil.rmtree(d, ignore_errors=True)
    sys.exit(code)
