"""mfsdp-train across emulated nodes (scripts/emulate_cluster.sh: network namespaces, shaped links,
Open MPI's multi-host launch): the same training results on 1x4, 2x2 and 4x1 nodes, the node
topology each rank sees, and the three faults (a link down, a node's processes killed, a link at a
crawl) with the resume on the surviving node, and scripts/bench_cluster.sh at small sizes. Stdlib only.

usage: test_cluster_cli.py BIN_DIR CASE PRINT_TOPOLOGY
Exit 77 when this machine does not permit namespaces or tc (emulate_cluster.sh says so)."""
import glob
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "train"))
from cli_common import ENV, ROOT, TINY, check, fresh_dir, read, run_case  # noqa: E402

EMULATE = os.path.join(ROOT, "scripts", "emulate_cluster.sh")
TIMEOUT_S = 3  # sharding.collective_timeout_s of the fault cases
# A surviving rank exits within the collective timeout plus this grace after a fault: the
# liveness probe (2 s), MPI_Abort's own bound (5 s) and the step's work in flight (3 s).
GRACE_S = 10
# The tiny model's step is sub-millisecond across nodes: enough steps to be mid-run at the fault.
# A constant learning rate: the resumed run's shorter training.steps leaves the schedule alone.
COMMON = ["schedule.decay=constant", "training.eval_interval=0", "sharding.debug_checks=false"]
LONG_RUN = [*COMMON, "training.steps=100000", "logging.interval=50", f"sharding.collective_timeout_s={TIMEOUT_S}"]


class NotPermitted(Exception):
    pass


def emulate(*args, check_rc=True):
    r = subprocess.run(["bash", EMULATE, *args], env=ENV, capture_output=True, text=True)
    if r.returncode == 77:
        raise NotPermitted(r.stderr.strip())
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"emulate_cluster.sh {' '.join(args)}: rc {r.returncode}: {r.stderr}")
    return r


def train_cmd(bin_dir, np, sets, config=TINY, hosts=None):
    # One thread per rank: the emulated nodes share this machine's cores, while mfsdp-train would
    # give each rank its node's share of them.
    # `hosts` (e.g. node0:2) keeps mpirun off the other nodes: it starts a daemon on every node of
    # its allocation, and would wait for an unreachable one.
    out = ["bash", EMULATE, "run", *(["--host", hosts] if hosts else []), "-np", str(np),
           os.path.join(bin_dir, "mfsdp-train"), "--config", config, "--threads", "1"]
    for s in sets:
        out += ["--set", s]
    return out


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def rank_pids(node):
    """The mfsdp-train processes of one emulated node."""
    pids = emulate("pids", str(node)).stdout.split()
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "mfsdp-train":
                    out.append(p)
        except OSError:
            pass
    return out


def topology_run(bin_dir, nodes, slots, sets, tag):
    """One short training run on nodes x slots; returns (summary, export bytes, output)."""
    run_dir, export = fresh_dir(f"run_{tag}"), os.path.join(fresh_dir(f"export_{tag}"), "model.safetensors")
    cmd = train_cmd(bin_dir, nodes * slots, [*sets, "training.steps=6", "training.eval_interval=3",
                                             f"logging.run_dir={run_dir}", f"output.export={export}"])
    t0 = time.time()
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    print(f"{tag}: rc {r.returncode} in {time.time() - t0:.1f} s")
    check(r.returncode == 0, f"{tag}: rc {r.returncode}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    if r.returncode != 0:
        return None, b"", r.stdout
    return summary(run_dir), read(export), r.stdout


def check_topology_printer(print_topology, nodes, slots):
    """Every rank's node-local rank (the GPU choice) matches the launcher's, on the right node."""
    r = subprocess.run(["bash", EMULATE, "run", "-np", str(nodes * slots), print_topology], env=ENV,
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"print_topology {nodes}x{slots}: rc {r.returncode}: {r.stderr[-800:]}")
    lines = sorted(re.findall(r"rank (\d+) node (\d+) local (\d+) of (\d+) name (\S+) nodes (\d+) per_node (\S+)", r.stdout),
                   key=lambda t: int(t[0]))
    check(len(lines) == nodes * slots, f"{nodes}x{slots}: {len(lines)} topology lines:\n{r.stdout}")
    for rank, node, local, size, name, n, per in lines:
        rank, node, local = int(rank), int(node), int(local)
        # Open MPI fills each node's slots in turn: rank r runs on node r // slots.
        want = (rank // slots, rank % slots, slots, f"node{rank // slots}", nodes, ",".join([str(slots)] * nodes))
        check((node, local, int(size), name, int(n), per) == want,
              f"{nodes}x{slots} rank {rank}: node {node} local {local} of {size} on {name}, {n} nodes ({per}); want {want}")


def case_topology(bin_dir, tmp, print_topology):
    """Bitwise the same state and export on 1x4, 2x2 and 4x1 nodes for matrixfsdp, fsdp2 and HSDP
    2x2 (replicas across nodes), and the topology every rank and summary.json report."""
    runs = {"matrixfsdp": [], "fsdp2": ["sharding.placement=fsdp2"], "hsdp": ["sharding.replicate=2"]}
    results = {}
    for nodes, slots in ((1, 4), (2, 2), (4, 1)):
        emulate("up", str(nodes), "--slots", str(slots))
        check_topology_printer(print_topology, nodes, slots)
        for name, sets in runs.items():
            s, export, out = topology_run(bin_dir, nodes, slots, sets, f"{name}_{nodes}x{slots}")
            if s is None:
                continue
            results[(name, nodes)] = (s["state_fingerprint"], export)
            check(s["nodes"] == nodes and s["ranks_per_node"] == [slots] * nodes and
                  s["node_names"] == [f"node{i}" for i in range(nodes)],
                  f"{name} {nodes}x{slots}: summary says {s['nodes']} nodes {s['ranks_per_node']} {s['node_names']}")
            check(f"topology: 4 rank(s) on {nodes} node(s), {slots} per node: node0 (rank" in out,
                  f"{name} {nodes}x{slots}: no topology line:\n{out[:1500]}")
            if name == "hsdp":
                want = {1: "HSDP layout: one node", 2: "HSDP layout: each shard group on one node, replicas across 2 nodes",
                        4: "HSDP layout: shard group 0 spans nodes node0, node1"}[nodes]
                check(want in out, f"hsdp {nodes}x{slots}: expected '{want}' in:\n{out[:2000]}")
    emulate("down")
    base = results.get(("matrixfsdp", 1))
    check(base is not None and len(results) == 9, f"only {len(results)} of 9 runs finished")
    for key, value in results.items():
        check(value[0] == base[0], f"{key}: state fingerprint {value[0]} != matrixfsdp 1x4's {base[0]}")
        check(value[1] == base[1], f"{key}: export bytes differ from matrixfsdp 1x4's")
    print(f"topology: {len(results)} runs, fingerprint {base[0] if base else None}")


def start_long_run(bin_dir, np, sets, out_dir):
    """A long run on the cluster, each rank's output in out_dir/1/rank.N/ (a partitioned node's
    ranks cannot reach mpirun's terminal). Returns the Popen once step 100 is logged."""
    cmd = train_cmd(bin_dir, np, [*LONG_RUN, *sets])
    cmd[3:3] = ["--output-filename", out_dir]  # mpirun options, after `run`
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 90
    while time.time() < deadline:
        if glob.glob(os.path.join(out_dir, "1", "rank.0", "stdout")):
            with open(os.path.join(out_dir, "1", "rank.0", "stdout")) as f:
                if re.search(r"step +100/", f.read()):
                    return p
        if p.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"the run did not reach step 100: rc {p.poll()}\n{p.stdout.read() if p.poll() is not None else ''}")


def watch_exits(nodes, t_fault, limit):
    """Seconds after t_fault at which each node's last rank exited (None: still running at limit)."""
    left = {n: None for n in range(nodes)}
    while time.time() < t_fault + limit:
        for n in range(nodes):
            if left[n] is None and not rank_pids(n):
                left[n] = time.time() - t_fault
        if all(v is not None for v in left.values()):
            break
        time.sleep(0.1)
    return left


def rank_text(out_dir, rank):
    text = ""
    for stream in ("stdout", "stderr"):
        path = os.path.join(out_dir, "1", f"rank.{rank}", stream)
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                text += f.read()
    return text


# What a report says of the other node after each fault: REPORT % (reporting node, other node).
REPORT = (r"\[comm\] rank \d on node%d: timed out after 3 s \(sharding.collective_timeout_s[^)]*\) in "
          r"\w+\([^)]*phase \w+\) at step \d+; ")
# Node 1 unreachable: node 0's ranks name both of its ranks as silent.
SILENT = r"no answer within 2 s from node%d \(ranks \d, \d\)"
# A crawling link may carry some answers in time and not others: the other node is named silent
# (all or part of it) or as the slowest to answer.
SILENT_OR_SLOW = (r"(?:no answer within 2 s from [^;]*node%d \(ranks? \d"
                  r"|every peer answered a liveness probe within 2 s \((?:[^()]*\([^)]*\))*[^()]*\); the slowest, "
                  r"rank \d on node%d)")


def find_report(out_dir, probe, reporters):
    """The first rank report of a node in `reporters` whose probe part matches `probe` about the
    other node; None if there is none."""
    for node in reporters:
        other = 1 - node
        pattern = REPORT % node + probe % ((other,) * probe.count("%d"))
        for rank in range(4):
            m = re.search(pattern, rank_text(out_dir, rank))
            if m:
                return m.group(0)
    return None


def fault_case(bin_dir, tmp, inject, sets=(), expect_probe=SILENT, reporters=(0,), expect_launcher=None):
    """2 nodes x 2 ranks, a checkpoint every 100 steps; `inject` hits node 1 mid-run. Every rank
    exits within TIMEOUT_S + GRACE_S, a rank on a node of `reporters` names the collective, phase,
    step and the other node's silent or slow peers (`expect_probe`),
    every checkpoint verifies, and node 0 resumes at world size 2 bitwise like an uninterrupted
    world-2 run."""
    emulate("up", "2", "--slots", "2")
    run_dir, ckpt, out_dir = fresh_dir("run"), fresh_dir("ckpt"), fresh_dir("ranks")
    p = start_long_run(bin_dir, 4, [f"logging.run_dir={run_dir}", f"checkpoint.dir={ckpt}", "checkpoint.interval=100",
                                    *sets], out_dir)
    t_fault = time.time()
    inject()
    exits = watch_exits(2, t_fault, TIMEOUT_S + GRACE_S + 5)
    print(f"ranks gone after {exits} s (bound {TIMEOUT_S + GRACE_S} s)")
    for n, t in exits.items():
        check(t is not None and t <= TIMEOUT_S + GRACE_S, f"node{n}'s ranks exited after {t} s (bound {TIMEOUT_S + GRACE_S} s)")
    try:
        launcher_out = p.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        launcher_out = p.communicate()[0]
        check(False, "mpirun still running 60 s after its ranks exited")
    check(p.returncode != 0, "mpirun exited 0 after a fault")
    if expect_launcher:
        check(re.search(expect_launcher, launcher_out) is not None,
              f"mpirun's output does not match {expect_launcher!r}:\n{launcher_out[-2500:]}")
    if expect_probe:
        report = find_report(out_dir, expect_probe, reporters)
        ranks = "".join(f"--- rank {r}:\n{rank_text(out_dir, r)[-1200:]}" for r in range(4))
        check(report is not None, f"no report naming the call, phase, step and the other node's ranks:\n{ranks}\n"
                                  f"mpirun: {launcher_out[-1500:]}")
        if report:
            print(f"report: {report}")
    saved = sorted(d for d in os.listdir(ckpt) if re.fullmatch(r"step_\d+", d))
    check(saved, f"no checkpoint in {ckpt}: {os.listdir(ckpt)}")
    for d in saved:  # a save cut short stays a step_N.tmp directory, which the next start removes
        r = subprocess.run([os.path.join(bin_dir, "mfsdp-ckpt"), "verify", os.path.join(ckpt, d)],
                           env=ENV, capture_output=True, text=True)
        check(r.returncode == 0, f"checkpoint {d} does not verify: {r.stdout}{r.stderr}")
    if not saved:
        return
    last = int(saved[-1].split("_")[-1])
    # World size 2 with twice the micro-batches keeps the global batch of the 4-rank run.
    sets = (*sets, "training.grad_accum=2")
    resumed = resume_on_node0(bin_dir, ckpt, last + 20, sets)
    fresh = fresh_dir("fresh")
    cmd = ["mpirun", "-np", "2", os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, "--threads", "1"]
    for s in (*COMMON, *sets, f"training.steps={last + 20}", f"logging.run_dir={fresh}"):
        cmd += ["--set", s]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"uninterrupted world-2 run: rc {r.returncode}: {r.stderr[-800:]}")
    if resumed and r.returncode == 0:
        want = summary(fresh)["state_fingerprint"]
        check(resumed == want, f"resumed on node0 at W=2: fingerprint {resumed} != uninterrupted W=2 run's {want}")
        if resumed == want:
            print(f"resumed from step {last} on node0 (W=2): fingerprint {resumed}, as the uninterrupted W=2 run")
    emulate("down")


def resume_on_node0(bin_dir, ckpt, steps, sets):
    """Resumes the checkpoint directory on node 0's two slots (world size 2): its fingerprint."""
    run_dir = fresh_dir("resume")
    sets = [*COMMON, *sets, f"training.steps={steps}", f"logging.run_dir={run_dir}", f"checkpoint.dir={ckpt}",
            "checkpoint.interval=100", "training.resume=auto"]
    r = subprocess.run(train_cmd(bin_dir, 2, sets, hosts="node0:2"), env=ENV, capture_output=True, text=True,
                       timeout=120)
    check(r.returncode == 0 and "resumed at step" in r.stdout,
          f"resume on node0: rc {r.returncode}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    return summary(run_dir)["state_fingerprint"] if r.returncode == 0 else None


def case_link_down(bin_dir, tmp, _):
    fault_case(bin_dir, tmp, lambda: emulate("link", "1", "down"))


def case_node_killed(bin_dir, tmp, _):
    # mpirun sees the daemon go and ends the job itself, often before a collective times out.
    fault_case(bin_dir, tmp, lambda: emulate("kill", "1", "KILL"), expect_probe=None,
               expect_launcher=r"lost communication with a remote daemon[\s\S]*on node node1|Peer host: +node1")


def case_link_crawl(bin_dir, tmp, _):
    # Width 128: a block's gather (~0.8 MB) takes seconds at 1mbit, past the timeout. Both sides
    # time out; node 1's ranks may abort the job through mpirun before node 0's probe ends, so a
    # report from either side counts.
    fault_case(bin_dir, tmp, lambda: emulate("link", "1", "1mbit"), sets=("model.n_embd=128",),
               expect_probe=SILENT_OR_SLOW, reporters=(0, 1))


def case_bench(bin_dir, tmp, _):
    """scripts/bench_cluster.sh at small sizes on 1 and 2 nodes: a report row per case, no link
    traffic on one node, link traffic on two, and less of it with HSDP (one replica per node: the
    gathers stay inside a node, only the replicas' exchange crosses)."""
    env = dict(ENV, NODES="1 2", LAYERS="1", SEQ="32", PLACEMENTS="matrixfsdp fsdp2", LINK_RATE="1gbit")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "bench_cluster.sh"), os.path.dirname(bin_dir), tmp],
                       env=env, capture_output=True, text=True, timeout=240)
    if r.returncode == 77:
        raise NotPermitted(r.stderr.strip())
    check(r.returncode == 0, f"bench_cluster.sh: rc {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    if r.returncode != 0:
        return
    rows = {}
    report = read(os.path.join(tmp, "REPORT.md")).decode()
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 12 and cells[0].isdigit():
            rows[(int(cells[0]), cells[1])] = cells
    want = [(1, "matrixfsdp"), (1, "fsdp2"), (2, "matrixfsdp"), (2, "fsdp2"), (2, "matrixfsdp (HSDP)"), (2, "fsdp2 (HSDP)")]
    check(sorted(rows) == sorted(want), f"report rows {sorted(rows)}, expected {sorted(want)}")
    link = {k: float(v[7]) for k, v in rows.items()}
    for p in ("matrixfsdp", "fsdp2"):
        if (1, p) in link and (2, p) in link and (2, f"{p} (HSDP)") in link:
            check(link[(1, p)] == 0, f"{p} on one node sent {link[(1, p)]} MB per step on its link")
            check(link[(2, p)] > 0, f"{p} on two nodes sent nothing on the links")
            check(link[(2, f"{p} (HSDP)")] < 0.5 * link[(2, p)],
                  f"{p} HSDP sent {link[(2, f'{p} (HSDP)')]} MB per step across nodes, not under half of "
                  f"the {link[(2, p)]} MB without it")
    print(report[:3000])


def emulate_in(state, *args):
    """emulate_cluster.sh ARGS with MFSDP_EMULATE_DIR=state; returns the CompletedProcess (77 raises)."""
    r = subprocess.run(["bash", EMULATE, *args], env=dict(ENV, MFSDP_EMULATE_DIR=state), capture_output=True, text=True)
    if r.returncode == 77:
        raise NotPermitted(r.stderr.strip())
    return r


def netns_names():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def case_ownership(bin_dir, tmp, _):
    """emulate_cluster.sh touches only what its state directory's `up` made: a second cluster's
    `down` leaves the first running; a directory of a user's is neither removed nor taken; an
    interrupted `up` leaves no namespace and no holder process; a state path that cannot be used
    and bench_cluster.sh's bad NODES are refused with one line, nothing made."""
    a, b, user = (os.path.join(tmp, n) for n in ("cluster_a", "cluster_b", "user_dir"))
    r = emulate_in(a, "up", "2")
    check(r.returncode == 0, f"up A: {r.stderr}")
    r = emulate_in(b, "up", "1")
    check(r.returncode == 0, f"up B: {r.stderr}")
    r = emulate_in(b, "down")
    check(r.returncode == 0 and not os.path.exists(b), f"down B: rc {r.returncode} {r.stderr}")
    status = emulate_in(a, "status").stdout
    check(status.count("processes 1") == 2 and emulate_in(a, "exec", "1", "--", "hostname").stdout.strip() == "node1",
          f"B's down touched A: {status}")
    os.makedirs(user)
    with open(os.path.join(user, "mine"), "w") as f:
        f.write("mine")
    for verb in (["down"], ["up", "1"]):
        r = emulate_in(user, *verb)
        check(r.returncode == 1 and "did not make" in r.stderr + r.stdout or "not the state directory" in r.stderr,
              f"{verb} in a user's directory: rc {r.returncode} {r.stderr}")
        check(read(os.path.join(user, "mine")) == b"mine" and os.listdir(user) == ["mine"], f"{verb} changed {user}")
    r = emulate_in(os.path.join(tmp, "it's"), "up", "1")
    check(r.returncode == 1 and "must be an absolute path of letters" in r.stderr, f"a quote in the state path: {r.stderr}")
    # up interrupted by TERM while it starts its nodes
    c = os.path.join(tmp, "cluster_c")
    p = subprocess.Popen(["bash", EMULATE, "up", "24"], env=dict(ENV, MFSDP_EMULATE_DIR=c),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag, holders = "", []
    deadline = time.time() + 30
    while time.time() < deadline and p.poll() is None:
        try:
            tag = read(os.path.join(c, "cluster")).decode().split()[-1]
            holders = [read(f).decode().strip() for f in glob.glob(os.path.join(c, "node*.pid"))]
            if len(holders) >= 2:
                break
        except (OSError, IndexError):
            pass
        time.sleep(0.01)
    p.send_signal(15)
    p.communicate(timeout=60)
    check(tag and p.returncode == 143, f"up was not interrupted while starting (rc {p.returncode}, tag {tag!r})")
    check(tag not in netns_names() and not os.path.exists(c), f"an interrupted up left {netns_names()} / {c}")
    alive = [h for h in holders if os.path.exists(f"/proc/{h}")]
    check(not alive, f"an interrupted up left holder processes {alive}")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "bench_cluster.sh"), os.path.dirname(bin_dir), tmp],
                       env=dict(ENV, NODES="1 x3"), capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and r.stderr.strip().startswith("bench_cluster.sh: NODES='1 x3': 'x3' is not a node count"),
          f"bench_cluster.sh with bad NODES: rc {r.returncode} {r.stderr}")
    check(emulate_in(a, "status").stdout.count("processes 1") == 2, "A did not survive")
    check(emulate_in(a, "down").returncode == 0 and not os.path.exists(a), "down A")


if __name__ == "__main__":
    extra = sys.argv[3]
    ns = {k: (lambda f: (lambda b, t: f(b, t, extra)))(v) for k, v in globals().items() if k.startswith("case_")}
    try:
        code = run_case(ns, "cluster")
    except NotPermitted as e:
        print(f"skipped: {e}")
        code = 77
    finally:
        subprocess.run(["bash", EMULATE, "down"], env=ENV, capture_output=True)
    sys.exit(code)
