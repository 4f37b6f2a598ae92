#!/usr/bin/env python3
"""End-to-end tests of mfsdp-train under mpirun (stdlib only; the PyTorch case needs torch).

usage: test_train_cli.py BIN_DIR CASE FAULT_BIN   with FAULT_BIN the test_train_faults binary
(tests/train/train_with_faults.cpp) and CASE one of
  bad_configs   every malformed config fails with its message and exit code 2 on every rank; config
                strings and data file names that are not UTF-8, and runtime.device cuda without a GPU, too
  bad_data      broken shards (magic, version, truncated, too short, token >= vocab) are refused
  configs       every config in configs/ is valid (--print-config)
  bad_outputs   exports over inputs, into directories, tokenizer/vocab mismatch; stale summaries
  other_runs_outputs  logging.trace / output.export over another run's files, a user's safetensors
                file or a sharded checkpoint: refused on every rank, nothing changed; the other run
                resumes and replaces its own export and trace
  outputs_links_and_locks  a metrics.jsonl that is a symbolic link is refused; a hard-linked snapshot
                of a run directory is unchanged by the run's resume; a single-file export over a
                Hugging Face directory's weights, and a trace or export inside a directory another
                running job holds locked, are refused; a trace path taken by another run after
                start-up is not written, and that run's file is kept
  e2e           tiny config, 20 steps at world 2: the loss falls, summary.json complete, opt-step bytes 0;
                without data.val the done line says there is no validation split
  world_sizes   -np 1/2/4 with grad_accum 4/2/1, shuffle off and on: bitwise-identical losses,
                metrics, state fingerprints and exports (cmp)
  export        export -> import -> --eval-only reproduces the final validation loss exactly; NaN
                init_from weights, and a config.json whose fields change GPT-2's maths, are refused;
                a NaN gradient (FAULT_BIN --nan-grad) stops the run
  torch         PyTorch loads the export and gets the same validation loss (within 1e-4)
  precision_auto   matmul_dtype / ns_dtype auto at -np 2 resolve alike on every rank and equal the
                   explicit -np 1 run bitwise
  mixed_precision  bf16 parameters and reduction track the f32 run (val loss within 1%), move half the
                gather bytes, log the step telemetry; recompute block prints the same losses
Exit 0 on success, 1 on failure, 77 when skipped.
"""
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

from cli_common import ENV, ROOT, TINY, check, read, read_jsonl, run_case, start_training, with_run_dir


def train(bin_dir, np, config, *sets, expect=0, args=()):
    """mpirun -np NP mfsdp-train --config CONFIG with each of `sets` as --set (in a fresh run
    directory unless one of them names logging.run_dir). Returns (exit code, stdout + stderr)."""
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"),
           "--config", config, *args]
    for s in with_run_dir(sets):
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if expect is not None and p.returncode != expect:
        print(out[-4000:])
    return p.returncode, out





def case_bad_configs(bin_dir, tmp):
    cfg_dir = os.path.join(ROOT, "tests", "config", "bad_configs")
    with open(os.path.join(cfg_dir, "expected.json")) as f:
        expected = json.load(f)
    for name, msg in sorted(expected.items()):
        rc, out = train(bin_dir, 2, os.path.join(cfg_dir, name), expect=2)
        check(rc == 2, f"{name}: exit code {rc}, expected 2")
        check(msg in out, f"{name}: message {msg!r} not in output:\n{out[-600:]}")
        check("(rank 0)" in out and "(rank 1)" in out, f"{name}: not reported on every rank:\n{out[-600:]}")
        check(name in out, f"{name}: the file name is not in the message")
    check_utf8_rule(bin_dir, tmp)
    # a bad --set override and a bad command line
    rc, out = train(bin_dir, 2, TINY, "training.steps=-1", expect=2)
    check(rc == 2 and "training.steps" in out, f"--set training.steps=-1: rc {rc}: {out[-300:]}")
    rc, out = train(bin_dir, 1, os.path.join(tmp, "missing.json"), expect=2)
    check(rc == 2 and "missing.json" in out, f"missing config file: rc {rc}: {out[-300:]}")
    # more threads than the one core the launcher bound the rank to: stopped, with the fix named
    p = subprocess.run(["mpirun", "-np", "1", "--bind-to", "core", os.path.join(bin_dir, "mfsdp-train"),
                        "--config", TINY, "--threads", "2", "--set", f"logging.run_dir={tmp}/threads"],
                       env=ENV, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    check(p.returncode == 2 and "--bind-to none" in out and "slot:PE=2" in out and "(CPUs " in out,
          f"--threads 2 on a rank bound to one core: rc {p.returncode}: {out[-400:]}")
    check(not os.path.exists(os.path.join(tmp, "threads", "metrics.jsonl")), "a run started despite the thread error")


def check_utf8_rule(bin_dir, tmp):
    """Every config string must be UTF-8 (JSON carries the config between ranks and into
    manifests): each path key, an enumeration and training.resume given a byte 0xff are refused on
    both ranks with exit 2 naming the key, nothing is created; so is --print-config; so is a data
    glob matching a file whose name is not UTF-8."""
    bad = os.path.join(tmp, "bad\udcff")  # surrogateescape: the byte 0xff in the argument
    for key in ("logging.run_dir", "data.train", "data.val", "data.tokenizer_path", "model.init_from",
                "output.export", "checkpoint.dir", "logging.trace", "training.resume", "sharding.placement"):
        rc, out = train(bin_dir, 2, TINY, f"{key}={bad}", expect=2)
        lines = [x for x in out.splitlines() if x.startswith("mfsdp-train: error")]
        check(rc == 2 and len(lines) == 2 and all(f"--set {key}={tmp}/bad\\xff: {key}: not valid UTF-8 (byte 0xff" in x
                                                 for x in lines), f"{key} not UTF-8: exit {rc}: {lines} {out[-400:]}")
        check(not [n for n in os.listdir(tmp) if n.startswith("bad")], f"{key} not UTF-8: something was created")
    p = subprocess.run([os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, "--print-config",
                        "--set", f"output.export={bad}"], env=ENV, capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "output.export: not valid UTF-8" in p.stderr and p.stdout == "",
          f"--print-config with output.export not UTF-8: exit {p.returncode}: {p.stdout[-200:]} {p.stderr[-300:]}")
    data = os.path.join(tmp, "utf8_data")
    os.makedirs(data)
    shutil.copy(os.path.join(ROOT, "data", "tiny_shakespeare_char_train.bin"), os.path.join(data, "tr\udcff.bin"))
    rc, out = train(bin_dir, 2, TINY, f"data.train={data}/*.bin", expect=2)
    lines = [x for x in out.splitlines() if x.startswith("mfsdp-train: error")]
    check(rc == 2 and len(lines) == 2 and all(f"data.train: {data}/*.bin matches {data}/tr\\xff.bin, whose name is not "
                                             "valid UTF-8" in x and TINY in x for x in lines),
          f"a data file name that is not UTF-8: exit {rc}: {lines} {out[-400:]}")
    # runtime.device cuda without a GPU (or in a build without CUDA) is a config error, not a failure
    if shutil.which("nvidia-smi") is None:
        rc, out = train(bin_dir, 2, TINY, "runtime.device=cuda", expect=2)
        lines = [x for x in out.splitlines() if x.startswith("mfsdp-train: error")]
        check(rc == 2 and len(lines) == 2 and all(f"{TINY}: runtime.device: cuda, but " in x for x in lines),
              f"runtime.device cuda without a GPU: exit {rc}: {lines} {out[-400:]}")


def write_shard(path, tokens, magic=20240520, version=1, ntok=None, truncate=0):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if ntok is None else ntok
    body = struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)
    with open(path, "wb") as f:
        f.write(body[:len(body) - truncate] if truncate else body)


def case_bad_data(bin_dir, tmp):
    good = [i % 65 for i in range(20000)]
    cases = {
        "magic.bin": (dict(magic=12345), "magic"),
        "version.bin": (dict(version=7), "version"),
        "truncated.bin": (dict(truncate=100), "truncated"),
        "short.bin": (dict(), "needs"),
        "vocab.bin": (dict(), "vocab"),
    }
    for name, (kw, msg) in cases.items():
        path = os.path.join(tmp, name)
        toks = good
        if name == "short.bin":
            toks = good[:100]
        if name == "vocab.bin":
            toks = list(good)
            toks[777] = 100
        write_shard(path, toks, **kw)
        rc, out = train(bin_dir, 2, TINY, f"data.train={path}", expect=2)
        check(rc == 2, f"{name}: exit code {rc}, expected 2")
        check(path in out and msg in out.lower(), f"{name}: message lacks the file or {msg!r}:\n{out[-600:]}")
        if name == "vocab.bin":
            check("777" in out, f"{name}: the offset of the bad token is not named:\n{out[-600:]}")


def case_configs(bin_dir, tmp):
    """Every shipped config is valid: --print-config succeeds and echoes its placement."""
    cfg_dir = os.path.join(ROOT, "configs")
    for name in sorted(os.listdir(cfg_dir)):
        if not name.endswith(".json"):
            continue
        p = subprocess.run([os.path.join(bin_dir, "mfsdp-train"), "--config", os.path.join(cfg_dir, name),
                            "--print-config"], env=ENV, capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, f"{name}: --print-config failed: {p.stderr[-400:]}")
        if p.returncode == 0:
            check("placement" in json.loads(p.stdout)["sharding"], f"{name}: no sharding.placement in the output")


def case_bad_outputs(bin_dir, tmp):
    """Outputs that would destroy an input, or that cannot be written, are refused before training."""
    train_copy = os.path.join(tmp, "train.bin")
    shutil.copy(os.path.join(ROOT, "data", "tiny_shakespeare_char_train.bin"), train_copy)
    before = open(train_copy, "rb").read(64)
    rc, out = train(bin_dir, 2, TINY, f"data.train={train_copy}", f"output.export={train_copy}", expect=2)
    check(rc == 2 and "output.export" in out and "data.train" in out, f"export over the training shard: rc {rc}: {out[-400:]}")
    check(open(train_copy, "rb").read(64) == before, "the training shard was modified")
    # a path ending in .safetensors names a file; any other path an export directory
    file_named_dir = os.path.join(tmp, "dir.safetensors")
    os.makedirs(file_named_dir)
    rc, out = train(bin_dir, 2, TINY, f"output.export={file_named_dir}", expect=2)
    check(rc == 2 and "is a directory" in out, f"export to a directory named .safetensors: rc {rc}: {out[-400:]}")
    rc, out = train(bin_dir, 2, TINY, f"output.export={os.path.join(tmp, 'train.bin', 'hf')}", expect=2)
    check(rc == 2 and "output.export" in out, f"export directory under a file: rc {rc}: {out[-400:]}")
    rc, out = train(bin_dir, 2, TINY, "model.vocab_size=80", expect=2)
    check(rc == 2 and "data.tokenizer_path" in out and "80" in out, f"tokenizer/vocab mismatch: rc {rc}: {out[-400:]}")
    # a stale summary from an earlier run in the same directory never survives a new run (one the
    # trainer wrote: its canonical dump with a state_fingerprint; anyone else's is refused, see
    # test_tools_cli.py run_dir_files)
    run = os.path.join(tmp, "run")
    os.makedirs(run)
    with open(os.path.join(run, "summary.json"), "w") as f:
        f.write(json.dumps({"stale": True, "state_fingerprint": "0"}, indent=2, sort_keys=True) + "\n")
    poisoned_lr = ["optimizer.adamw.lr=1e6", "optimizer.muon.lr=1e6", "training.grad_clip=0", "training.steps=1"]
    train(bin_dir, 2, TINY, f"logging.run_dir={run}", "model.init_std=1000", *poisoned_lr, expect=None)
    if os.path.exists(os.path.join(run, "summary.json")):
        with open(os.path.join(run, "summary.json")) as f:
            check("stale" not in f.read(), "a stale summary.json survived a new run")


def tree(d):
    """Every file under `d` (relative path -> bytes)."""
    return {os.path.relpath(os.path.join(r, f), d): read(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs}


def case_other_runs_outputs(bin_dir, tmp):
    """logging.trace and output.export replace only a trace / an export that mfsdp-train wrote: another
    run's files, a user's safetensors file and a sharded checkpoint are refused on every rank (exit 2,
    the key and the path named), byte for byte unchanged, and the other run still resumes."""
    quick = ["training.steps=2", "training.sample_tokens=0", "training.eval_interval=0", "checkpoint.interval=1"]
    base, trace = os.path.join(tmp, "base"), os.path.join(tmp, "trace.json")
    window = ["logging.trace_start=1", "logging.trace_steps=1"]
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={base}", f"output.export={base}/hf", f"logging.trace={trace}",
                    *window, *quick)
    check(rc == 0 and os.path.isfile(os.path.join(base, "hf", "model.safetensors")), f"the other run: rc {rc}: {out[-400:]}")
    mine = os.path.join(tmp, "mine.safetensors")  # a safetensors file that is no export (a checkpoint's rank file)
    shutil.copy(os.path.join(base, "checkpoints", "step_00000002", "rank_00000.safetensors"), mine)
    sharded = os.path.join(tmp, "sharded")  # save_pretrained's sharded layout: shards and their index
    os.makedirs(sharded)
    for i in (1, 2):
        shutil.copy(mine, os.path.join(sharded, f"model-0000{i}-of-00002.safetensors"))
    with open(os.path.join(sharded, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {}}, f)
    kept = {d: tree(d) for d in (base, sharded)}
    kept_mine = read(mine)
    foreign = "was not written by mfsdp-train as"
    refusals = [("logging.trace", os.path.join(base, "metrics.jsonl"), f"{foreign} a trace"),
                ("logging.trace", os.path.join(base, "config.json"), f"{foreign} a trace"),
                ("output.export", base, f"{os.path.join(base, 'config.json')} {foreign} an export's config.json"),
                ("output.export", os.path.join(base, "hf", "config.json"), "is a file"),
                ("output.export", mine, f"{foreign} an export's weights"),
                ("output.export", sharded, "holds other weights (model-00001-of-00002.safetensors, "
                                           "model-00002-of-00002.safetensors, model.safetensors.index.json)")]
    for key, path, needle in refusals:
        rc, out = train(bin_dir, 2, TINY, f"{key}={path}", *quick, expect=2)
        for rank in (0, 1):
            line = next((x for x in out.splitlines() if f"error (rank {rank})" in x), "")
            check(rc == 2 and f"{key}: {path}" in line and needle in line,
                  f"{key}={path}: rank {rank}: rc {rc}, expected {needle!r}: {out[-600:]}")
    check(all(tree(d) == files for d, files in kept.items()) and read(mine) == kept_mine,
          "a refused run changed a file it did not write")
    # the other run resumes, and replaces its own export and trace (mfsdp-train wrote them)
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={base}", f"output.export={base}/hf", f"logging.trace={trace}",
                    "logging.trace_start=3", "training.resume=auto", *quick[1:], "training.steps=3")
    check(rc == 0 and "resumed" in out.lower() and read(trace).startswith(b'{"displayTimeUnit":"ms","traceEvents":[\n'),
          f"the other run's resume over its own export and trace: rc {rc}: {out[-600:]}")
    check(read(os.path.join(base, "hf", "model.safetensors")) != kept[base][os.path.join("hf", "model.safetensors")],
          "the resumed run did not replace its own export")


def case_outputs_links_and_locks(bin_dir, tmp):
    quick = ["training.steps=2", "training.sample_tokens=0", "training.eval_interval=0"]
    base = os.path.join(tmp, "base")
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={base}", f"output.export={base}/hf", *quick)
    check(rc == 0, f"the first run: rc {rc}: {out[-400:]}")
    kept = tree(base)
    # 1. a run directory whose metrics.jsonl links to another run's history
    linked = os.path.join(tmp, "linked")
    os.makedirs(linked)
    os.symlink(os.path.join(base, "metrics.jsonl"), os.path.join(linked, "metrics.jsonl"))
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={linked}", *quick, expect=2)
    check(rc == 2 and "metrics.jsonl is a symbolic link" in out, f"symlinked metrics.jsonl: rc {rc}: {out[-400:]}")
    # 2. a single-file export named over a Hugging Face export directory's weights; a run directory's own
    # config.json beside a single-file export is no export's, so the default job's layout trains and exports
    rc, out = train(bin_dir, 2, TINY, f"output.export={base}/hf/model.safetensors", *quick, expect=2)
    check(rc == 2 and "is the weights file of the Hugging Face export directory" in out,
          f"single-file export into an export directory: rc {rc}: {out[-400:]}")
    own = os.path.join(tmp, "own")
    for attempt in range(2):  # the second run finds the first one's config.json and model.safetensors
        rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={own}", f"output.export={own}/model.safetensors",
                        "checkpoint.at_end=false", *quick)
        check(rc == 0 and "exported the model" in out, f"an export in its own run directory, run {attempt}: rc {rc}: {out[-400:]}")
    # 3. outputs inside a directory another running job holds locked (this test holds the lock)
    held = os.path.join(tmp, "held")
    os.makedirs(held)
    lock = open(os.path.join(held, ".mfsdp.lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    for key, path in [("logging.trace", os.path.join(held, "sub", "t.json")), ("output.export", os.path.join(held, "m.safetensors"))]:
        rc, out = train(bin_dir, 2, TINY, f"{key}={path}", *quick, expect=2)
        check(rc == 2 and f"{key}: {path} is inside {held}, a directory of another mfsdp-train job" in out,
              f"{key} inside a locked run directory: rc {rc}: {out[-400:]}")
    lock.close()
    check(tree(base) == kept, "a refused run changed the other run's files")
    # 4. a hard-linked snapshot (rsync --link-dest, cp -l) stays as it was when the run resumes
    snap = os.path.join(tmp, "snap")
    for r, _, files in os.walk(base):
        os.makedirs(os.path.join(snap, os.path.relpath(r, base)), exist_ok=True)
        for f in files:
            os.link(os.path.join(r, f), os.path.join(snap, os.path.relpath(r, base), f))
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={base}", f"output.export={base}/hf", "training.resume=auto",
                    *quick[1:], "training.steps=3")
    check(rc == 0 and len(read_jsonl(os.path.join(base, "metrics.jsonl"))) > len(read_jsonl(os.path.join(snap, "metrics.jsonl"))),
          f"the resume beside a snapshot: rc {rc}: {out[-400:]}")
    # (a lock file names its holder, in place: replacing it could let two jobs lock two files)
    changed = sorted(f for f in set(kept) | set(tree(snap)) if kept.get(f) != tree(snap).get(f) and not f.endswith(".lock"))
    check(not changed, f"the resume changed the hard-linked snapshot: {changed}")
    # 5. the trace path is taken by another run after this run's start-up: not written, that file kept
    later = os.path.join(tmp, "later")
    cmd = ["mpirun", "-np", "2", "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config", TINY]
    for x in [f"logging.run_dir={os.path.join(tmp, 'racer')}", f"logging.trace={later}/metrics.jsonl",
              "training.steps=400", "logging.trace_start=400", "logging.trace_steps=1", *quick[1:]]:
        cmd += ["--set", x]
    p, out = start_training(cmd)
    os.makedirs(later, exist_ok=True)  # start-up made it for the trace
    theirs = b'{"type": "a record of another program"}\n'
    with open(os.path.join(later, "metrics.jsonl"), "wb") as f:
        f.write(theirs)
    rest, _ = p.communicate(timeout=600)
    out += rest
    check(p.returncode == 0 and "the trace is not written" in out and "was not written by mfsdp-train as a trace" in out,
          f"a trace path taken after start-up: rc {p.returncode}: {out[-600:]}")
    check(read(os.path.join(later, "metrics.jsonl")) == theirs, "the run wrote its trace over another run's file")


def case_e2e(bin_dir, tmp):
    run = os.path.join(tmp, "run")
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={run}")
    check(rc == 0, f"training failed with {rc}")
    if rc:
        return
    train_lines = [m for m in read_jsonl(os.path.join(run, "metrics.jsonl")) if m["type"] == "train"]
    check(len(train_lines) == 20, f"expected 20 train records, got {len(train_lines)}")
    first = sum(m["loss"] for m in train_lines[:3]) / 3
    last = sum(m["loss"] for m in train_lines[-3:]) / 3
    check(last < first - 0.3, f"loss did not fall: first {first:.4f}, last {last:.4f}")
    with open(os.path.join(run, "summary.json")) as f:
        s = json.load(f)
    keys = ["world_size", "placement", "steps", "tokens", "wall_seconds", "final_train_loss", "final_val_loss",
            "best_val_loss", "time_to_target_seconds", "optimizer_step_seconds_median", "phase_seconds",
            "comm_bytes", "peak_bytes"]
    for k in keys:
        check(k in s, f"summary.json lacks {k}")
    for k in ["forward", "backward", "reduce", "optimizer"]:
        check(k in s.get("phase_seconds", {}), f"phase_seconds lacks {k}")
    for k in ["fwd_gather", "bwd_gather", "grad_reduce", "opt_step", "other"]:
        check(k in s.get("comm_bytes", {}), f"comm_bytes lacks {k}")
    check(s.get("world_size") == 2 and s.get("placement") == "matrixfsdp", "world_size/placement wrong")
    check(s.get("comm_bytes", {}).get("opt_step") == 0, f"matrixfsdp opt_step bytes {s.get('comm_bytes')}")
    check(s.get("comm_bytes", {}).get("grad_reduce", 0) > 0, "no gradient reduction traffic counted")
    check(s.get("tokens") == 20 * 2 * 4 * 32, f"tokens {s.get('tokens')}")
    check("sample" in out, "no text sample printed")
    check("final val loss " in out and "best val " in out, f"no validation losses on the done line:\n{out[-600:]}")
    # Without data.val the done line says so instead of printing NaN losses; summary.json has nulls.
    run = os.path.join(tmp, "no_val")
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={run}", "data.val=", "training.steps=2",
                    "training.sample_tokens=0")
    check(rc == 0, f"training without data.val failed with {rc}")
    done = [line for line in out.splitlines() if "done: " in line]
    check(len(done) == 1 and "no validation split (data.val is empty)" in done[0] and "nan" not in done[0].lower(),
          f"done line without data.val: {done}")
    if rc == 0:
        s = json.loads(read(os.path.join(run, "summary.json")))
        check(s["final_val_loss"] is None and s["best_val_loss"] is None, "summary.json: validation losses not null")


LOSS_LINE = re.compile(r"step\s+(\d+)/\d+ \| loss (\S+) \| lr (\S+) \| grad norm (\S+)")


def case_world_sizes(bin_dir, tmp):
    """-np 1 x grad_accum 4, -np 2 x 2 and -np 4 x 1 (same global batch) are bitwise identical:
    the same loss lines, metrics, state fingerprints and byte-identical exports. The guarantee is
    for the same CPU threads per rank (--threads 1 here; the default divides the cores by the ranks)."""
    for shuffle in ("false", "true"):
        seen = {}
        for np, accum in [(1, 4), (2, 2), (4, 1)]:
            run = os.path.join(tmp, f"s{shuffle}_w{np}")
            model = os.path.join(tmp, f"s{shuffle}_w{np}.safetensors")
            rc, out = train(bin_dir, np, TINY, f"logging.run_dir={run}", f"data.shuffle={shuffle}",
                            f"training.grad_accum={accum}", "training.micro_batch_size=2", "training.steps=10",
                            "training.eval_interval=5", "training.sample_tokens=0", f"output.export={model}",
                            args=("--threads", "1"))
            check(rc == 0, f"shuffle {shuffle}: world {np} x grad_accum {accum} failed")
            if rc:
                return
            with open(os.path.join(run, "summary.json")) as f:
                summary = json.load(f)
            records = [(m["type"], m["step"], m.get("loss"), m.get("grad_norm"), m.get("clip_coef"), m.get("val_loss"))
                       for m in read_jsonl(os.path.join(run, "metrics.jsonl")) if m["type"] in ("train", "eval")]
            with open(model, "rb") as f:
                exported = f.read()
            seen[np] = (LOSS_LINE.findall(out), records, summary["state_fingerprint"], exported,
                        summary["final_val_loss"])
            print(f"shuffle={shuffle} -np {np} grad_accum={accum}: state_fingerprint {summary['state_fingerprint']}, "
                  f"final val loss {summary['final_val_loss']!r}")
        lines1, records1, fp1, export1, val1 = seen[1]
        check(len(lines1) == 10 and sum(r[0] == "train" for r in records1) == 10, "missing train records")
        for np in (2, 4):
            lines, records, fp, exported, val = seen[np]
            check(lines == lines1, f"shuffle {shuffle}: -np {np} printed other loss lines than -np 1")
            check(records == records1, f"shuffle {shuffle}: -np {np} metrics differ from -np 1: {records} vs {records1}")
            check(fp == fp1, f"shuffle {shuffle}: -np {np} state_fingerprint {fp} != {fp1}")
            check(exported == export1, f"shuffle {shuffle}: -np {np} export differs from -np 1 (cmp)")
            check(val == val1, f"shuffle {shuffle}: -np {np} final val loss {val!r} != {val1!r}")


def case_world_sizes_bf16(bin_dir, tmp):
    """optimizer.muon.ns_dtype=bf16 (Newton-Schulz products in bf16): -np 1 x grad_accum 4, -np 2 x 2
    and -np 4 x 1 give the same loss lines and state fingerprint (--threads 1: the owner of a matrix
    runs the same bf16 GEMMs whatever the world size), and the run differs from the f32 one."""
    seen = {}
    for np, accum, dtype in [(1, 4, "bf16"), (2, 2, "bf16"), (4, 1, "bf16"), (2, 2, "f32")]:
        run = os.path.join(tmp, f"w{np}_{dtype}")
        rc, out = train(bin_dir, np, TINY, f"logging.run_dir={run}", f"optimizer.muon.ns_dtype={dtype}",
                        f"training.grad_accum={accum}", "training.micro_batch_size=2", "training.steps=4",
                        "training.eval_interval=4", "training.sample_tokens=0", args=("--threads", "1"))
        check(rc == 0, f"ns_dtype {dtype}: world {np} x grad_accum {accum} failed")
        if rc:
            return
        with open(os.path.join(run, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run, "config.json")) as f:
            check(json.load(f)["optimizer"]["muon"]["ns_dtype"] == dtype, "config.json lacks ns_dtype")
        seen[(np, dtype)] = (LOSS_LINE.findall(out), summary["state_fingerprint"])
        print(f"ns_dtype={dtype} -np {np} grad_accum={accum}: state_fingerprint {summary['state_fingerprint']}")
    lines1, fp1 = seen[(1, "bf16")]
    check(len(lines1) == 4, "missing loss lines")
    for np in (2, 4):
        lines, fp = seen[(np, "bf16")]
        check(lines == lines1, f"ns_dtype bf16: -np {np} printed other loss lines than -np 1")
        check(fp == fp1, f"ns_dtype bf16: -np {np} state_fingerprint {fp} != {fp1}")
    check(seen[(2, "f32")][1] != seen[(2, "bf16")][1], "ns_dtype bf16 left the state equal to f32's")


def case_precision_auto(bin_dir, tmp):
    """precision.matmul_dtype and optimizer.muon.ns_dtype auto at -np 2: the start-up line names the
    dtypes the ranks resolved (from probe rates summed over the ranks, so every rank runs the same),
    config.json keeps "auto", and the run is bitwise the -np 1 x grad_accum 2 run that asks for
    those dtypes explicitly."""
    common = ("training.micro_batch_size=2", "training.steps=3", "training.eval_interval=3",
              "training.sample_tokens=0")
    run = os.path.join(tmp, "auto")
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={run}", "precision.matmul_dtype=auto",
                    "optimizer.muon.ns_dtype=auto", "training.grad_accum=1", *common, args=("--threads", "1"))
    check(rc == 0, "auto at -np 2 failed")
    if rc:
        return
    m = re.search(r"compute precision: matmuls (f32|bf16) \(precision\.matmul_dtype auto\), "
                  r"Newton-Schulz (f32|bf16) \(optimizer\.muon\.ns_dtype auto\)", out)
    check(m is not None, "the start-up line does not name the resolved dtypes")
    check("GEMM probe" in out and "Newton-Schulz step probe" in out and "MFU denominator: measured" in out,
          "the probe rates or the MFU denominator are not on the start-up line")
    if m is None:
        return
    with open(os.path.join(run, "config.json")) as f:
        cfg = json.load(f)
    check(cfg["precision"]["matmul_dtype"] == "auto" and cfg["optimizer"]["muon"]["ns_dtype"] == "auto",
          "config.json does not keep auto")
    with open(os.path.join(run, "summary.json")) as f:
        fp2 = json.load(f)["state_fingerprint"]
    run1 = os.path.join(tmp, "explicit")
    rc, out1 = train(bin_dir, 1, TINY, f"logging.run_dir={run1}", f"precision.matmul_dtype={m.group(1)}",
                     f"optimizer.muon.ns_dtype={m.group(2)}", "training.grad_accum=2", *common,
                     args=("--threads", "1"))
    check(rc == 0, "the explicit -np 1 run failed")
    if rc:
        return
    with open(os.path.join(run1, "summary.json")) as f:
        fp1 = json.load(f)["state_fingerprint"]
    print(f"auto -> matmuls {m.group(1)}, NS {m.group(2)}: -np 2 {fp2}, -np 1 explicit {fp1}")
    check(LOSS_LINE.findall(out) == LOSS_LINE.findall(out1), "auto -np 2 printed other loss lines than -np 1")
    check(fp1 == fp2, f"auto -np 2 state_fingerprint {fp2} != explicit -np 1 {fp1}")


def case_mixed_precision(bin_dir, tmp):
    """The same 40 steps at world 2 in f32, in f32 with fused attention, in bf16 (parameters and
    reduction) and in bf16 with activation recompute, prefetching and the gradient reduction
    overlapped with backward (all three bitwise equal to the plain bf16 run). Fused attention sums in another order than
    the unfused kernel, so its losses differ only by f32 rounding (bound: 1e-4 of the loss). bf16 keeps 8 significant bits (relative rounding <= 2^-9) in the gathered
    weights and matmul operands; on this model the losses differ by about 0.1%, so 1% is a bound
    that only a broken mixed-precision path (wrong scaling, unrounded or double-rounded sums) exceeds."""
    runs = {}
    for name, sets in [("f32", []), ("f32_fused", ["runtime.attention=fused"]),
                       ("bf16", ["precision.param_dtype=bf16", "precision.reduce_dtype=bf16"]),
                       ("bf16_recompute", ["precision.param_dtype=bf16", "precision.reduce_dtype=bf16",
                                           "training.recompute=block", "sharding.prefetch_depth=1",
                                           "sharding.overlap_reduce=on"])]:
        run = os.path.join(tmp, name)
        rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={run}", "training.steps=40", "training.eval_interval=0",
                        "training.sample_tokens=0", *sets)
        check(rc == 0, f"{name}: training failed with {rc}")
        if rc:
            return
        with open(os.path.join(run, "summary.json")) as f:
            summary = json.load(f)
        runs[name] = (LOSS_LINE.findall(out), summary, read_jsonl(os.path.join(run, "metrics.jsonl")), out)
        print(f"{name}: final val loss {summary['final_val_loss']:.5f}, fwd_gather bytes "
              f"{summary['comm_bytes']['fwd_gather']}")
    f32, bf16, rec = runs["f32"], runs["bf16"], runs["bf16_recompute"]
    v32, v16 = f32[1]["final_val_loss"], bf16[1]["final_val_loss"]
    check(abs(v16 - v32) < 0.01 * v32, f"bf16 val loss {v16} vs f32 {v32}: more than 1% apart")
    check(v16 != v32, "bf16 and f32 gave the same val loss: the bf16 path did not run")
    for a, b in zip(f32[0], bf16[0]):
        check(abs(float(a[1]) - float(b[1])) < 0.01 * float(a[1]), f"step {a[0]}: loss {b[1]} (bf16) vs {a[1]} (f32)")
    g32, g16 = f32[1]["comm_bytes"]["fwd_gather"], bf16[1]["comm_bytes"]["fwd_gather"]
    check(g32 > 0 and 2 * g16 == g32, f"bf16 fwd_gather bytes {g16}, f32 {g32}: not half")
    check(rec[0] == bf16[0], "recompute + overlap printed other loss lines than the plain bf16 run")
    check(rec[1]["state_fingerprint"] == bf16[1]["state_fingerprint"], "recompute + overlap changed the final state")
    check("reduce overlap: off" in bf16[3] and "reduce overlap: on" in rec[3], "reduce overlap banner missing")
    check("precision: parameters bf16, matmuls bf16 (" in bf16[3] and ", gradient reduction bf16" in bf16[3],
          "precision banner missing")
    check("MFU denominator: measured bf16 GEMM rate" in bf16[3], "the measured MFU denominator is not named")
    check("(bf16 matmuls " in bf16[3], "the CPU's bf16 matmul path (oneDNN or widened to f32) is not named")
    fused = runs["f32_fused"]
    check("attention: unfused" in f32[3] and "attention: fused" in fused[3], "attention kernel banner missing")
    vf = fused[1]["final_val_loss"]
    check(abs(vf - v32) < 1e-4 * v32, f"fused attention val loss {vf} vs unfused {v32}: more than 1e-4 apart")
    for a, b in zip(f32[0], fused[0]):
        check(abs(float(a[1]) - float(b[1])) < 1e-4 * float(a[1]), f"step {a[0]}: loss {b[1]} (fused) vs {a[1]}")
    for m in (m for m in bf16[2] if m["type"] == "train"):
        t = m.get("rank0_step", {})
        check(t.get("orthogonalizations", 0) > 0 and t.get("optimizer_step_bytes") == 0
              and t.get("host_device_bytes") == 0, f"step telemetry of step {m['step']}: {t}")


def exported_run(bin_dir, tmp):
    run = os.path.join(tmp, "exp")
    model = os.path.join(tmp, "model.safetensors")
    rc, out = train(bin_dir, 2, TINY, f"logging.run_dir={run}", f"output.export={model}", "training.steps=8",
                    "training.sample_tokens=0")
    check(rc == 0 and os.path.exists(model), f"export run failed ({rc})")
    with open(os.path.join(run, "summary.json")) as f:
        final_val = json.load(f)["final_val_loss"]
    return model, final_val


def case_export(bin_dir, tmp):
    model, final_val = exported_run(bin_dir, tmp)
    cmd_base = [os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, "--set", f"model.init_from={model}",
                "--eval-only"]
    for np in (1, 3):
        p = subprocess.run(["mpirun", "-np", str(np), "--oversubscribe"] + cmd_base, env=ENV, capture_output=True,
                           text=True, timeout=600)
        check(p.returncode == 0, f"--eval-only at world {np} failed: {p.stdout[-500:]}{p.stderr[-500:]}")
        got = None
        for line in p.stdout.splitlines():
            if line.startswith("validation loss"):
                got = float(line.split()[2])
        check(got is not None and abs(got - final_val) <= 5e-6,
              f"world {np}: --eval-only loss {got} != final val loss {final_val}")
    # one SIGINT (Ctrl-C) during --eval-only ends it at once, saying so: there is nothing to save
    val = os.path.join(tmp, "long_val")
    os.makedirs(val)
    with open(TINY) as f:
        val_glob = json.load(f)["data"]["val"]
    source = sorted(glob.glob(os.path.join(os.path.dirname(TINY), val_glob)))[0]
    for i in range(40):  # 40 copies of the validation shard: seconds of evaluation
        shutil.copy(source, os.path.join(val, f"val_{i:02d}.bin"))
    cmd = ["mpirun", "-np", "2", "--oversubscribe", *cmd_base, "--threads", "1", "--set", f"data.val={val}/val_*.bin"]
    p, out = start_training(cmd, pattern=r"^topology:")
    ranks = subprocess.run(["pgrep", "-f", "-P", str(p.pid), "mfsdp-train"], capture_output=True, text=True).stdout.split()
    for pid in ranks:
        os.kill(int(pid), signal.SIGINT)
    rest, _ = p.communicate(timeout=120)
    out += rest
    check(len(ranks) == 2 and p.returncode != 0 and "SIGINT: stopping now (--eval-only has nothing to save)" in out
          and "validation loss" not in out, f"SIGINT during --eval-only: rc {p.returncode}, ranks {ranks}: {out[-800:]}")
    # NaN weights in init_from are refused before training, naming the tensor (exit 2, no export)
    poisoned = os.path.join(tmp, "poisoned.safetensors")
    shutil.copy(model, poisoned)
    with open(poisoned, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        begin = header["h.0.mlp.c_fc.weight"]["data_offsets"][0]
        f.seek(8 + n + begin)
        f.write(struct.pack("<f", float("nan")))
    out_model = os.path.join(tmp, "never.safetensors")
    rc, out = train(bin_dir, 2, TINY, f"model.init_from={poisoned}", f"output.export={out_model}", expect=None)
    check(rc == 2 and "h.0.mlp.c_fc.weight" in out and "non-finite" in out,
          f"NaN in init_from not reported (rc {rc}): {out[-600:]}")
    check(not os.path.exists(out_model), "a model with NaN weights was exported")
    # a NaN gradient under a finite loss stops before any optimizer step, clipping on or off
    # (the fault: test_train_faults trains a test-only model whose h.1.mlp.c_fc.weight gradient gets a NaN)
    for clip in ("0", "1.0"):
        p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.argv[3], "--nan-grad", "h.1.mlp.c_fc.weight",
                            "--config", TINY, "--set", f"training.grad_clip={clip}",
                            "--set", f"output.export={out_model}",
                            "--set", f"logging.run_dir={os.path.join(tmp, 'nan' + clip)}"],
                           env=ENV, capture_output=True, text=True, timeout=600)
        out = p.stdout + p.stderr
        check(p.returncode != 0 and "gradient norm is nan" in out and "h.1.mlp.c_fc.weight" in out
              and "clip_coefficient" not in out and "step      1/" not in out,
              f"grad_clip {clip}: NaN gradient not reported before the first step (rc {p.returncode}): {out[-600:]}")
        check(not os.path.exists(out_model), f"grad_clip {clip}: a model was exported after a NaN gradient")
    # a file that does not match the config is refused before training
    rc, out = train(bin_dir, 2, TINY, f"model.init_from={model}", "model.n_embd=64", expect=2)
    check(rc == 2 and model in out, f"mismatched init_from accepted (rc {rc}): {out[-400:]}")
    # a from_pretrained directory whose config.json asks for other maths is refused on every rank,
    # naming the key, the file and the field (models/README.md lists the fields)
    hf = os.path.join(tmp, "hf")
    os.makedirs(hf)
    shutil.copy(model, os.path.join(hf, "model.safetensors"))
    config = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32, "vocab_size": 65,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "reorder_and_upcast_attn": True}
    for key, value in (("layer_norm_epsilon", 1e-3), ("scale_attn_weights", False),
                       ("scale_attn_by_inverse_layer_idx", True), ("activation_function", "gelu"), (None, None)):
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump({**config, key: value} if key else config, f)
        rc, out = train(bin_dir, 2, TINY, f"model.init_from={hf}", "training.steps=1",
                        "training.sample_tokens=0", expect=None)
        if key is None:  # the same maths (reorder_and_upcast_attn only changes fp16 precision) trains
            check(rc == 0, f"init_from with GPT-2's own config.json: rc {rc}: {out[-400:]}")
            continue
        errors = [x for x in out.splitlines() if "mfsdp-train: error (rank" in x]
        check(rc == 2 and len(errors) == 2 and all(f"model.init_from: [import_hf_gpt2] {hf}: config.json: {key}" in x
                                                   for x in errors), f"config.json {key}={value}: rc {rc}: {out[-600:]}")


def case_torch(bin_dir, tmp):
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode != 0:
        print("torch is not importable: skipping")
        return 77
    model, final_val = exported_run(bin_dir, tmp)
    val = os.path.join(ROOT, "data", "tiny_shakespeare_char_val.bin")
    with open(val, "rb") as f:
        ntok = struct.unpack("<3i", f.read(12))[2]
    T = 32
    n_seq = (ntok - 1) // T
    p = subprocess.run([py, os.path.join(ROOT, "tests", "scripts", "torch_eval_export.py"), model, val,
                        "--batch", str(n_seq), "--seq", str(T)], capture_output=True, text=True, timeout=600)
    check(p.returncode == 0, f"torch_eval_export failed: {p.stderr[-800:]}")
    if p.returncode == 0:
        loss = json.loads(p.stdout.strip().splitlines()[-1])["loss"]
        check(abs(loss - final_val) <= 1e-4, f"PyTorch loss {loss} vs MatrixFSDP {final_val}")
        print(f"PyTorch {loss:.6f} vs MatrixFSDP {final_val:.6f} over {n_seq} sequences")
    return 0


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp"))
