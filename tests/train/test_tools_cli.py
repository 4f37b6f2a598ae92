#!/usr/bin/env python3
"""Inputs and outputs of every tool (stdlib only; mfsdp-train under mpirun).

usage: test_tools_cli.py BIN_DIR CASE [SEAL_BIN]   with SEAL_BIN test_seal_manifest (tests/train/seal_manifest.cpp,
for ckpt_manifest) and CASE one of
  prepare_outputs  mfsdp-prepare: -o dir/ refused; an input name that is not UTF-8 is escaped in the
                   char meta; a malformed JSONL line named cleanly; an input that is also an output (the `dir -o dir/tok` re-run) and a
                   foreign file named like an output are refused before anything is touched, even
                   with --overwrite; a failed --overwrite run leaves the old outputs; a good one
                   replaces them and removes the old shards it no longer writes
  run_dir_files    a user's metrics.jsonl / summary.json (or a FIFO) in logging.run_dir: refused,
                   unchanged; the trainer's own files from an earlier run are replaced; a resume drops a
                   cut last line of metrics.jsonl, so every line is one JSON record
  fifo             a FIFO (and /dev/zero) as every input kind of every tool, and as logging.trace and
                   output.export: refused naming the path, exit 2, within seconds (each command runs
                   under a timeout: a hang fails the case)
  bounds           every tool's numeric options (and the numbers of a --compare file and of a cluster
                   JSON) out of range: exit 2 naming the option or field (and the file); a --compare
                   file that is malformed, and --replicate not dividing a --worlds size, too
  export_temps     an export removes the temporaries a killed export left (writer gone, untouched 10 min), and
                   keeps those of a live or recent writer, the user's own files and other files' temporaries
  json_out         --json to an unwritable path: exit 2 naming it (mfsdp-bench before measuring);
                   a good path gets complete JSON
  ckpt_manifest    a (sealed) manifest whose tensor claims 1 TiB: mfsdp-ckpt export and diff refuse it
                   naming the field, before allocating; a manifest whose config is a string: refused
                   naming the field by mfsdp-ckpt and by both ranks of a resume
Exit 0 on success, 1 on failure.
"""
import json
import os
import shutil
import stat
import subprocess
import sys

from cli_common import ENV, ROOT, TINY, check, merged_sets, run_case

DATA = os.path.join(ROOT, "data")


def run(cmd, timeout=120):
    """(exit code, output); a command still running after `timeout` seconds is a hang: -999."""
    try:
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, errors="replace", timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return -999, f"HUNG after {timeout}s: {cmd}: {e.stdout or ''}{e.stderr or ''}"
    return p.returncode, p.stdout + p.stderr


def mpirun(np, exe, *args):
    return ["mpirun", "-np", str(np), "--oversubscribe", exe, *args]


def sets_args(sets):
    """--set overrides as command-line arguments."""
    return [a for s in sets for a in ("--set", s)]


def put(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def snapshot(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))
            if os.path.isfile(os.path.join(d, n))}


def case_prepare_outputs(bin_dir, tmp):
    prep = os.path.join(bin_dir, "mfsdp-prepare")
    corpus = os.path.join(tmp, "corpus")
    put(os.path.join(corpus, "a.txt"), "First citizen: we are accounted poor citizens.\n" * 40)
    put(os.path.join(corpus, "b.txt"), "All: speak, speak.\n" * 40)
    tok = os.path.join(corpus, "tok")
    rc, out = run([prep, corpus, "-o", tok, "--tokenizer", "char", "-q", "--shard-tokens", "500"])
    check(rc == 0, f"first run: {rc} {out}")
    before = snapshot(corpus)
    check(len([n for n in before if n.startswith("tok_train_")]) >= 3, f"shards: {sorted(before)}")
    # the common re-run: the old outputs are inputs now, and --overwrite would destroy them
    for extra in ([], ["--overwrite"]):
        rc, out = run([prep, corpus, "-o", tok, "--tokenizer", "char", "-q", *extra])
        check(rc == 2 and "is also an output" in out and "tok_" in out, f"input named like an output {extra}: {rc} {out}")
        check(snapshot(corpus) == before, f"the re-run {extra} changed the directory")
    # the same file through another name (a hard link) is refused too
    outdir = os.path.join(tmp, "out")
    rc, out = run([prep, os.path.join(corpus, "a.txt"), "-o", os.path.join(outdir, "p"), "-q"])
    check(rc == 0, f"gpt2 run: {rc} {out}")
    link = os.path.join(tmp, "link.bin")
    os.link(os.path.join(outdir, "p_train.bin"), link)
    old = snapshot(outdir)
    rc, out = run([prep, link, "-o", os.path.join(outdir, "p"), "--format", "text", "-q", "--overwrite"])
    check(rc == 2 and "is also an output" in out, f"hard link to an output as input: {rc} {out}")
    check(snapshot(outdir) == old, "the hard-link run changed the outputs")
    # a failing --overwrite run (invalid UTF-8) leaves the old outputs as they were
    bad = os.path.join(tmp, "bad.txt")
    with open(bad, "wb") as f:
        f.write(b"fine text\n\xff broken\n")
    rc, out = run([prep, bad, "-o", os.path.join(outdir, "p"), "-q", "--overwrite"])
    check(rc == 2 and "invalid UTF-8" in out, f"bad input with --overwrite: {rc} {out}")
    check(snapshot(outdir) == old, f"a failed --overwrite run touched the old outputs: {sorted(snapshot(outdir))}")
    # a foreign file named like an output is never replaced, even with --overwrite
    mine = os.path.join(outdir, "p_val.bin")
    os.remove(mine)
    put(mine, "my notes, not a token shard\n")
    rc, out = run([prep, os.path.join(corpus, "a.txt"), "-o", os.path.join(outdir, "p"), "-q", "--overwrite"])
    check(rc == 2 and "not written by mfsdp-prepare" in out and "p_val.bin" in out, f"foreign output: {rc} {out}")
    check(open(mine).read() == "my notes, not a token shard\n", "the foreign p_val.bin was changed")
    # a good --overwrite run replaces the outputs and removes old shards it does not write again
    os.remove(mine)
    rc, out = run([prep, os.path.join(corpus, "a.txt"), "-o", os.path.join(outdir, "p"), "-q", "--shard-tokens", "100", "--overwrite"])
    check(rc == 0, f"sharded run: {rc} {out}")
    rc, out = run([prep, os.path.join(corpus, "b.txt"), "-o", os.path.join(outdir, "p"), "-q", "--overwrite"])
    names = sorted(snapshot(outdir))
    check(rc == 0 and names == ["p_train.bin", "p_val.bin"], f"--overwrite result: {rc} {names} {out}")
    # a prefix that ends in a directory is refused naming the fix, nothing written
    for prefix in (outdir + "/", os.path.join(outdir, "."), "."):
        rc, out = run([prep, os.path.join(corpus, "a.txt"), "-o", prefix, "-q"])
        check(rc == 2 and f"output prefix {prefix} names a directory" in out and "corpus_train.bin" in out,
              f"-o {prefix}: exit {rc}: {out[-300:]}")
    check(sorted(snapshot(outdir)) == names and not os.path.exists("_train.bin"), "a refused -o dir/ wrote a file")
    # an input whose name is not UTF-8: the char meta JSON names it with the byte escaped
    odd = os.path.join(tmp, "odd")
    put(os.path.join(odd, "caf\udce9.txt"), "All: speak, speak.\n" * 40)
    rc, out = run([prep, os.path.join(odd, "caf\udce9.txt"), "-o", os.path.join(odd, "tok"), "--tokenizer", "char", "-q"])
    meta = json.load(open(os.path.join(odd, "tok_meta.json"))) if rc == 0 else {}
    check(rc == 0 and meta.get("source") == "caf\\xe9.txt", f"input name not UTF-8: exit {rc}: {meta.get('source')} {out[-300:]}")
    # a malformed JSONL line: the file, the line and the reason, not the JSON library's exception text
    jsonl = os.path.join(tmp, "docs.jsonl")
    put(jsonl, '{"text": "fine"}\n{"text": "cut\n')
    rc, out = run([prep, jsonl, "-o", os.path.join(tmp, "j", "p"), "-q"])
    check(rc == 2 and f"{jsonl}:2: invalid JSON: parse error at line 1" in out and "json.exception" not in out,
          f"malformed JSONL line: exit {rc}: {out[-300:]}")


def case_run_dir_files(bin_dir, tmp):
    train = os.path.join(bin_dir, "mfsdp-train")
    base_sets = ["training.steps=2", "training.sample_tokens=0", "training.eval_interval=0", "checkpoint.at_end=false"]
    base = ["--config", TINY, *sets_args(base_sets)]
    for name, text in (("metrics.jsonl", '{"my": "own log"}\n'), ("summary.json", "my summary\n"),
                       ("metrics.jsonl", "")):
        rdir = os.path.join(tmp, "user_" + name + str(len(text)))
        put(os.path.join(rdir, name), text)
        if text == "":  # an empty metrics.jsonl holds nothing to lose: the run may take it
            continue
        rc, out = run(mpirun(2, train, *base, "--set", f"logging.run_dir={rdir}"))
        check(rc == 2 and "not written by mfsdp-train" in out and name in out, f"a user's {name}: {rc} {out[-500:]}")
        check(open(os.path.join(rdir, name)).read() == text, f"the user's {name} was changed")
        written = [n for n in os.listdir(rdir) if os.path.isfile(os.path.join(rdir, n)) and n not in (name, ".mfsdp.lock")]
        check(not written, f"the refused run wrote into the directory: {written}")
    fdir = os.path.join(tmp, "fifo_run")
    os.makedirs(fdir)
    os.mkfifo(os.path.join(fdir, "metrics.jsonl"))
    rc, out = run(mpirun(2, train, *base, "--set", f"logging.run_dir={fdir}"), timeout=60)
    check(rc == 2 and "FIFO" in out and "metrics.jsonl" in out, f"a FIFO as metrics.jsonl: {rc} {out[-500:]}")
    # the trainer's own files of an earlier run are replaced
    own = os.path.join(tmp, "own")
    for attempt in range(2):
        rc, out = run(mpirun(2, train, *base, "--set", f"logging.run_dir={own}"))
        check(rc == 0, f"run {attempt} into its own run directory: {rc} {out[-500:]}")
    types = [json.loads(x)["type"] for x in open(os.path.join(own, "metrics.jsonl")).read().splitlines()]
    check(types.count("train") == 2, f"metrics.jsonl after two fresh runs holds the second run only: {types}")
    # a run killed inside a metrics.jsonl write left a cut last line: the resumed run drops it, so every
    # line is one JSON record, and says so
    cut = os.path.join(tmp, "cut")
    rc, out = run(mpirun(2, train, "--config", TINY, *sets_args(merged_sets(base_sets, ["checkpoint.at_end=true"])), "--set", f"logging.run_dir={cut}",
                         "--set", "logging.interval=1"))
    check(rc == 0, f"run to resume: {rc} {out[-500:]}")
    metrics = os.path.join(cut, "metrics.jsonl")
    whole = open(metrics).read()
    with open(metrics, "a") as f:
        f.write('{"type": "train", "step": 3, "lo')
    rc, out = run(mpirun(2, train, "--config", TINY, *sets_args(merged_sets(base_sets, ["training.steps=4"])), "--set", f"logging.run_dir={cut}",
                         "--set", "training.resume=auto", "--set", "logging.interval=1"))
    text = open(metrics).read()
    try:
        records = [json.loads(x) for x in text.splitlines()]
    except ValueError as e:
        records = [f"not JSON: {e}"]
    steps = [r.get("step") for r in records if isinstance(r, dict) and r.get("type") == "train"]
    check(rc == 0 and text.startswith(whole) and steps == [1, 2, 3, 4], f"resume after a cut line: {rc} {steps} {text[-300:]}")
    check("dropped its last 32 bytes" in out, f"the dropped bytes are not reported: {out[-400:]}")


def case_export_temps(bin_dir, tmp):
    train = os.path.join(bin_dir, "mfsdp-train")
    export = os.path.join(tmp, "export")
    os.makedirs(export)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that runs no process now
    old = 3600
    files = {  # name -> (age in seconds, kept?)
        f".model.safetensors.tmp-{gone.pid}-0123456789abcdef": (old, False),   # abandoned: removed
        f".config.json.tmp-{gone.pid}-fedcba9876543210": (old, False),         # abandoned: removed
        f".model.safetensors.tmp-{os.getpid()}-0000000000000001": (old, True),  # its writer runs
        f".model.safetensors.tmp-{gone.pid}-0000000000000002": (0, True),       # written just now (another node?)
        "model.safetensors.tmp": (old, True),                                    # the user's own file
        f".notes.txt.tmp-{gone.pid}-0000000000000003": (old, True),             # another file's name
    }
    for name, (age, _) in files.items():
        path = os.path.join(export, name)
        put(path, "partial")
        os.utime(path, (os.path.getmtime(path) - age, os.path.getmtime(path) - age))
    rc, out = run(mpirun(2, train, "--config", TINY, "--set", "training.steps=2", "--set", "training.sample_tokens=0",
                         "--set", "training.eval_interval=0", "--set", "checkpoint.at_end=false",
                         "--set", f"logging.run_dir={os.path.join(tmp, 'run')}", "--set", f"output.export={export}"))
    left = sorted(os.listdir(export))
    expected = sorted(["model.safetensors", "config.json"] + [n for n, (_, kept) in files.items() if kept])
    check(rc == 0 and left == expected, f"export over stale temporaries: exit {rc}: left {left}, expected {expected} {out[-300:]}")


def case_fifo(bin_dir, tmp):
    fifo = os.path.join(tmp, "pipe")
    os.mkfifo(fifo)
    b = lambda exe: os.path.join(bin_dir, exe)  # noqa: E731
    train = [*mpirun(2, b("mfsdp-train")), "--config", TINY, "--set", f"logging.run_dir={os.path.join(tmp, 'r')}"]
    ckpt = os.path.join(tmp, "ckpt")
    os.makedirs(ckpt)
    os.mkfifo(os.path.join(ckpt, "manifest.json"))
    fifo_export = os.path.join(tmp, "pipe.safetensors")  # outputs: never opened, never replaced
    os.mkfifo(fifo_export)
    hf = os.path.join(tmp, "hf")  # a from_pretrained directory whose config.json is a FIFO
    os.makedirs(hf)
    os.mkfifo(os.path.join(hf, "config.json"))
    cases = [
        ("mfsdp-prepare input", [b("mfsdp-prepare"), fifo, "-o", os.path.join(tmp, "o", "p"), "-q"], "FIFO"),
        ("mfsdp-prepare --tokenizer", [b("mfsdp-prepare"), TINY, "-o", os.path.join(tmp, "o", "p"), "--tokenizer", fifo], "FIFO"),
        ("mfsdp-prepare /dev/zero", [b("mfsdp-prepare"), "/dev/zero", "-o", os.path.join(tmp, "o", "p")], "character device"),
        ("mfsdp-train --config", [*mpirun(2, b("mfsdp-train")), "--config", fifo], "FIFO"),
        ("mfsdp-plan --config", [b("mfsdp-plan"), "--config", fifo, "--world-size", "2"], "FIFO"),
        ("data.train", [*train, "--set", f"data.train={fifo}"], "FIFO"),
        ("data.val", [*train, "--set", f"data.val={fifo}"], "FIFO"),
        ("data.train /dev/zero", [*train, "--set", "data.train=/dev/zero"], "character device"),
        ("data.tokenizer_path", [*train, "--set", f"data.tokenizer_path={fifo}"], "FIFO"),
        ("model.init_from file", [*train, "--set", f"model.init_from={fifo}"], "FIFO"),
        ("model.init_from directory", [*train, "--set", f"model.init_from={hf}"], ""),
        ("logging.trace", [*train, "--set", f"logging.trace={fifo}"], "FIFO"),
        ("output.export", [*train, "--set", f"output.export={fifo_export}"], "FIFO"),
        ("training.resume", [*train, "--set", f"training.resume={ckpt}"], "manifest.json"),
        ("mfsdp-ckpt verify", [b("mfsdp-ckpt"), "verify", ckpt], "FIFO"),
        ("mfsdp-ckpt export", [b("mfsdp-ckpt"), "export", ckpt, os.path.join(tmp, "x.safetensors")], "FIFO"),
        ("mfsdp-ckpt diff", [b("mfsdp-ckpt"), "diff", ckpt, ckpt], "FIFO"),
        ("mfsdp-project --cluster", [b("mfsdp-project"), "--cluster", fifo], "FIFO"),
        ("mfsdp-project --compare", [b("mfsdp-project"), "--cluster", os.path.join(ROOT, "configs", "clusters",
                                     "a100_80gb_8x.json"), "--compare", fifo], "FIFO"),
        ("mfsdp-bench-tokenizer", [b("mfsdp-bench-tokenizer"), fifo], "FIFO"),
    ]
    for what, cmd, word in cases:
        rc, out = run(cmd, timeout=60)
        check(rc == 2 and word in out, f"{what}: a FIFO/device input: exit {rc}: {out[-400:]}")
        # the refusal names the input: the FIFO itself, the FIFO inside a directory, or the device
        named = ("/dev/zero" if "/dev/zero" in cmd or "data.train=/dev/zero" in cmd else
                 os.path.join(hf, "config.json") if f"model.init_from={hf}" in cmd else
                 os.path.join(ckpt, "manifest.json") if ckpt in cmd or f"training.resume={ckpt}" in cmd else fifo)
        check(named in out, f"{what}: the message does not name {named}: {out[-400:]}")
    check(stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISFIFO(os.stat(fifo_export).st_mode),
          "a FIFO named as logging.trace or output.export was replaced")


def case_bounds(bin_dir, tmp):
    b = lambda exe: os.path.join(bin_dir, exe)  # noqa: E731
    text = os.path.join(DATA, "tinyshakespeare.txt")
    prep = [b("mfsdp-prepare"), text, "-o", os.path.join(tmp, "p"), "-q"]
    cluster = ["--cluster", os.path.join(ROOT, "configs", "clusters", "a100_80gb_8x.json")]
    cases = [
        (prep + ["--threads", "0"], "--threads"), (prep + ["--threads", "100000"], "--threads"),
        (prep + ["--shard-tokens", "-1"], "--shard-tokens"), (prep + ["--shard-tokens", "3000000000"], "--shard-tokens"),
        (prep + ["--val-tokens", "-5"], "--val-tokens"), (prep + ["--val-fraction", "1.5"], "--val-fraction"),
        ([b("mfsdp-project"), *cluster, "--replicate", "0"], "--replicate"),
        ([b("mfsdp-project"), *cluster, "-B", "0"], "--batch"), ([b("mfsdp-project"), *cluster, "-B", "-4"], "--batch"),
        ([b("mfsdp-project"), *cluster, "-T", "0"], "--seq"), ([b("mfsdp-project"), *cluster, "--worlds", "0"], "--worlds"),
        ([b("mfsdp-project"), *cluster, "--ns-steps", "0"], "--ns-steps"),
        ([b("mfsdp-project"), *cluster, "--layers", "-1"], "--layers"),
        ([b("mfsdp-project"), *cluster, "--tolerance", "0"], "--tolerance"),
        ([b("mfsdp-bench"), "--replicate", "0"], "--replicate"), ([b("mfsdp-bench"), "-B", "0"], "--batch"),
        ([b("mfsdp-bench"), "-T", "-1"], "--seq"), ([b("mfsdp-bench"), "--steps", "0"], "--steps"),
        ([b("mfsdp-bench"), "--ns-steps", "0"], "--ns-steps"), ([b("mfsdp-bench"), "--warmup", "-1"], "--warmup"),
        ([b("mfsdp-bench-comm"), "--min-bytes", "0"], "--min-bytes"),
        ([b("mfsdp-bench-comm"), "--max-bytes", "1P"], "--max-bytes"),
        ([b("mfsdp-bench-model"), "--n-layer", "0"], "--n-layer"), ([b("mfsdp-bench-model"), "-B", "0"], "--batch"),
        ([b("mfsdp-bench-model"), "--threads", "-2"], "--threads"),
        ([b("mfsdp-bench-model"), "--device", "tpu"], "--device"),
        ([b("mfsdp-bench-model"), "--peak-tflops", "-1"], "--peak-tflops"),
        ([b("mfsdp-bench-tokenizer"), text, "--threads", "0"], "--threads"),
        ([b("mfsdp-bench-tokenizer"), text, "--reps", "0"], "--reps"),
        ([b("mfsdp-bench-orthogonalize"), "0"], "repetitions"),
        ([b("mfsdp-plan"), "--config", TINY, "--world-size", "0"], "--world-size"),
        ([b("mfsdp-train"), "--config", TINY, "--threads", "0"], "--threads"),
    ]
    for cmd, name in cases:
        if not os.path.exists(cmd[0]):
            check(False, f"{cmd[0]} is not built")
            continue
        rc, out = run(cmd, timeout=60)
        check(rc == 2 and name in out, f"{' '.join(os.path.basename(c) for c in cmd)}: exit {rc}: {out[-300:]}")
    check(not os.path.exists(os.path.join(tmp, "p_train.bin")), "a refused mfsdp-prepare wrote output")
    # the numbers of a --compare file are bounded like the options
    row = {"model": "gpt2-124m", "layers": 2, "placement": "matrixfsdp", "ns_steps": 5, "dtype": "f32", "batch": 1,
           "seq": 64, "world": 2, "ms": {"optimizer": 1.0, "total": 2.0}}
    for field, value in (("batch", 0), ("world", 0), ("replicas", 3), ("seq", -1)):
        bench = os.path.join(tmp, f"bench_{field}.json")
        with open(bench, "w") as f:
            json.dump({"results": [dict(row, **{field: value})]}, f)
        rc, out = run([b("mfsdp-project"), *cluster, "--compare", bench])
        check(rc == 2 and f"results[0].{field}: out of range" in out, f"--compare with {field} {value}: exit {rc}: {out[-300:]}")


    # a --compare file that is not JSON, or whose fields have other types: the file and the field, never the
    # JSON library's exception text
    for name, text, expect in (("not_json", '{"results": [', "invalid JSON: parse error at line 1"),
                               ("no_results", '{"rows": []}', "results: expected a list of mfsdp-bench results"),
                               ("model_number", json.dumps({"results": [dict(row, model=7)]}),
                                "results[0].model: type must be string, but is number"),
                               ("no_ms", json.dumps({"results": [{k: v for k, v in row.items() if k != "ms"}]}),
                                "results[0].ms: missing")):
        bench = os.path.join(tmp, f"bench_{name}.json")
        put(bench, text)
        rc, out = run([b("mfsdp-project"), *cluster, "--compare", bench])
        check(rc == 2 and f"{bench}: {expect}" in out and "json.exception" not in out,
              f"--compare {name}: exit {rc}: {out[-300:]}")
    # HSDP replicas must divide every world size of the sweep (no silently empty table)
    for args, expect in ((["--replicate", "3"], "--replicate 3 does not divide the world size 8, 16, 32, 64, 128, 256, 512"),
                         (["--replicate", "3", "--worlds", "6", "8"], "--replicate 3 does not divide the world size 8 "),
                         (["--replicate", "2", "--placements", "ddp", "--worlds", "8"], "--replicate 2: ddp has no shard group")):
        rc, out = run([b("mfsdp-project"), *cluster, *args])
        check(rc == 2 and expect in out and "step_ms" not in out, f"mfsdp-project {' '.join(args)}: exit {rc}: {out[-300:]}")
    rc, out = run([b("mfsdp-project"), *cluster, "--replicate", "3", "--worlds", "6", "12"])
    rows = [x for x in out.splitlines() if x.split()[:1] in (["6"], ["12"]) and "ratio" not in x]
    check(rc == 0 and len(rows) == 6, f"--replicate 3 --worlds 6 12: exit {rc}, {len(rows)} rows (3 placements x 2): {out[-400:]}")

    # every number of a cluster JSON is bounded: exit 2 naming the file and the field
    base = json.load(open(os.path.join(ROOT, "configs", "clusters", "a100_80gb_8x.json")))
    for field, value in (("gpus_per_node", "0"), ("memory_gb", "-80"), ("reserve_gb", "81"), ("mem_GBps", "0"),
                         ("intra_GBps", "1e300"), ("inter_latency_us", "-1"), ("launch_us", '"6"'),
                         ("model_efficiency", "0"), ("cores_per_node", "-1"), ("gemm_curve_f32", "[[0, 0.5]]")):
        bad = os.path.join(tmp, f"cluster_{field}.json")
        text = json.dumps(dict(base, **{field: None}))
        with open(bad, "w") as f:
            f.write(text.replace(f'"{field}": null', f'"{field}": {value}'))
        rc, out = run([b("mfsdp-project"), "--cluster", bad, "--worlds", "8"])
        check(rc == 2 and f"{bad}: {field}:" in out, f"cluster {field} = {value}: exit {rc}: {out[-300:]}")
    # without a visible GPU (or a CUDA build), --device cuda stops at once, saying which
    if shutil.which("nvidia-smi") is None:
        rc, out = run([b("mfsdp-bench-model"), "--device", "cuda"], timeout=60)
        check(rc == 2 and "--device cuda:" in out, f"mfsdp-bench-model --device cuda without a GPU: exit {rc}: {out[-300:]}")


def case_json_out(bin_dir, tmp):
    cluster = ["--cluster", os.path.join(ROOT, "configs", "clusters", "a100_80gb_8x.json")]
    project = [os.path.join(bin_dir, "mfsdp-project"), *cluster, "--worlds", "8"]
    for where in (os.path.join(tmp, "missing", "out.json"), tmp, "/proc/version"):
        rc, out = run([*project, "--json", where])
        check(rc == 2 and "--json" in out and where in out, f"mfsdp-project --json {where}: exit {rc}: {out[-300:]}")
    good = os.path.join(tmp, "p.json")
    rc, out = run([*project, "--json", good])
    check(rc == 0 and json.load(open(good))["projection"][0]["placement"] == "matrixfsdp", f"--json: {rc} {out[-300:]}")
    check(os.listdir(tmp) == ["p.json"], f"temporaries left: {os.listdir(tmp)}")
    bench = os.path.join(bin_dir, "mfsdp-bench")
    rc, out = run([bench, "--layers", "1", "-T", "8", "--json", os.path.join(tmp, "missing", "b.json")], timeout=60)
    check(rc == 2 and "--json" in out and "headline" not in out, f"mfsdp-bench --json unwritable: {rc} {out[-300:]}")


def case_ckpt_manifest(bin_dir, tmp):
    train = os.path.join(bin_dir, "mfsdp-train")
    run_dir = os.path.join(tmp, "run")
    rc, out = run(mpirun(2, train, "--config", TINY, "--set", "training.steps=2", "--set", "training.sample_tokens=0",
                         "--set", "training.eval_interval=0", "--set", "checkpoint.at_end=true",
                         "--set", f"logging.run_dir={run_dir}"))
    check(rc == 0, f"training run: {rc} {out[-500:]}")
    good = os.path.join(run_dir, "checkpoints", "step_00000002")
    manifest = json.load(open(os.path.join(good, "manifest.json")))

    def edited(name, fn):
        d = os.path.join(tmp, name)
        shutil.copytree(good, d)
        m = json.loads(json.dumps(manifest))
        m.pop("manifest_xxh3", None)
        fn(m)
        path = os.path.join(d, "manifest.json")
        with open(path, "w") as f:
            json.dump(m, f, indent=1)
        p = subprocess.run([sys.argv[3], path], capture_output=True, text=True)
        check(p.returncode == 0, f"test_seal_manifest {path}: {p.stderr}")
        return d

    def huge(m):  # tensors[0] claims 2^38 elements (1 TiB) in one piece per state
        t = m["tensors"][0]
        t["shape"] = [1 << 19, 1 << 19]
        for kind, pieces in t["pieces"].items():
            if pieces:
                t["pieces"][kind] = [dict(pieces[0], offset=0, numel=1 << 38 if kind != "v" or t["optimizer"] != "muon"
                                          else 1 << 19)]
    big = edited("big", huge)
    ckpt = os.path.join(bin_dir, "mfsdp-ckpt")
    for cmd in ([ckpt, "export", big, os.path.join(tmp, "x.safetensors")], [ckpt, "diff", big, good]):
        rc, out = run(cmd, timeout=60)
        check(rc == 2 and "tensors[0]" in out and "claims" in out and "bytes, but its files hold" in out,
              f"{cmd[1]} of a manifest claiming 1 TiB: exit {rc}: {out[-400:]}")
    check(not os.path.exists(os.path.join(tmp, "x.safetensors")), "export wrote a file for a refused manifest")
    typed = edited("typed", lambda m: m.__setitem__("config", "not an object"))
    rc, out = run([ckpt, "export", typed, os.path.join(tmp, "y.safetensors")], timeout=60)
    check(rc == 2 and "config" in out and "expected an object" in out, f"export, config a string: exit {rc}: {out[-400:]}")
    rc, out = run(mpirun(2, train, "--config", TINY, "--set", f"training.resume={typed}",
                         "--set", f"logging.run_dir={os.path.join(tmp, 'resumed')}"), timeout=120)
    lines = [x for x in out.splitlines() if x.startswith("mfsdp-train: error")]
    check(rc == 2 and len(lines) == 2 and all("config" in x for x in lines),
          f"resume, config a string: exit {rc}: refused on both ranks naming config? {lines} {out[-400:]}")


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp_tools"))
