#!/usr/bin/env python3
"""End-to-end tests of the Mixture-of-Experts family (model.arch qwen2_moe) in mfsdp-train under
mpirun (stdlib only).

usage: test_moe_cli.py BIN_DIR CASE with CASE one of
  exactness   configs/moe_tiny_test.json for 6 steps under matrixfsdp at -np 1/2/4 with grad_accum
              4/2/1, fsdp2 at -np 2 and 4, zero1 at -np 4 (one micro-batch per rank,
              as zero1 is exact), HSDP (sharding.replicate 2) at -np 4, and experts that stay
              with their owners (sharding.expert_parallel) at -np 2 and 4 (the latter with
              prefetched gathers and overlapped reductions): the
              same loss lines, validation loss and state fingerprint as -np 1 (bitwise); the run
              without the router losses ends elsewhere (their gradients reach the routers); the
              loss falls; metrics.jsonl's expert_load is the same at every world size and counts
              k = 2 assignments per layer for every token of each window
  resume      a run saved at step 3 (-np 2, matrixfsdp, grad_accum 2) resumes at -np 1 (matrixfsdp),
              -np 4 (fsdp2), -np 4 (HSDP, replicate 2) and -np 4 with expert parallelism, and one
              saved with expert parallelism resumes at -np 1 without, the same 8 sequences per
              step: each ends with the uninterrupted -np 2 run's loss lines for steps 4-6,
              validation loss and state fingerprint (bitwise)
  refusals    MoE keys on another architecture, bf16 matmuls and an export without a shared expert are refused on every
              rank with the key named (exit 2)
Exit 0 on success, 1 on failure.
"""
import os
import re
import subprocess
import sys

from cli_common import ENV, ROOT, check, read_jsonl, run_case, run_trainer

MOE_TINY = os.path.join(ROOT, "configs", "moe_tiny_test.json")
LOSS_LINE = re.compile(r"step\s+(\d+)/\d+ \| loss (\S+) \| lr (\S+) \| grad norm (\S+)")


def train(bin_dir, np, *sets, expect=0):
    """mpirun -np NP mfsdp-train --config moe_tiny_test.json --threads 1 with `sets` as --set, in a
    fresh run directory. Returns (exit code, output, summary.json with its train records, or None)."""
    rc, out, run_dir, summary = run_trainer(bin_dir, np, MOE_TINY, sets, expect)
    if summary is not None:
        summary["train_records"] = [m for m in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
                                    if m["type"] == "train"]
    return rc, out, summary


def check_expert_load(key, records):
    """Each train record's expert_load: 2 layers, k * (tokens of its window) assignments per layer,
    shares of 4 experts summing to 1 with min and max among them."""
    before = 0
    for r in records:
        layers = r["expert_load"]
        check(isinstance(layers, list) and len(layers) == 2, f"{key}: expert_load {layers!r}")
        for layer in layers or []:
            check(layer["assignments"] == 2 * (r["tokens"] - before),
                  f"{key} step {r['step']}: {layer['assignments']} assignments for {r['tokens'] - before} tokens")
            check(len(layer["fraction"]) == 4 and abs(sum(layer["fraction"]) - 1) < 1e-12
                  and layer["min"] == min(layer["fraction"]) and layer["max"] == max(layer["fraction"]),
                  f"{key} step {r['step']}: {layer}")
        before = r["tokens"]


def case_exactness(bin_dir, tmp):
    common = ("training.steps=6", "training.micro_batch_size=2", "training.eval_interval=6",
              "training.sample_tokens=0", "data.shuffle=true")
    runs = [("matrixfsdp", 1, 4, 1, False), ("matrixfsdp", 2, 2, 1, False), ("matrixfsdp", 4, 1, 1, False),
            ("fsdp2", 2, 2, 1, False), ("fsdp2", 4, 1, 1, False), ("zero1", 4, 1, 1, False),
            ("matrixfsdp", 4, 1, 2, False), ("matrixfsdp", 2, 2, 1, True), ("matrixfsdp", 4, 1, 1, True)]
    seen = {}
    for placement, np, accum, replicate, ep in runs:
        # the -np 4 expert-parallel run also prefetches gathers and overlaps the reductions
        overlap = ("sharding.overlap_reduce=on", "sharding.prefetch_depth=1") if ep and np == 4 else ()
        rc, out, s = train(bin_dir, np, *common, f"sharding.placement={placement}", f"training.grad_accum={accum}",
                           f"sharding.replicate={replicate}", f"sharding.expert_parallel={'true' if ep else 'false'}",
                           *overlap)
        key = (placement + (" expert_parallel" if ep else ""), np, replicate)
        check(rc == 0, f"{key}: exit {rc}")
        if rc:
            return 1
        seen[key] = (LOSS_LINE.findall(out), s["state_fingerprint"], s["final_val_loss"],
                     [r["expert_load"] for r in s["train_records"]])
        experts_bytes = s["comm_bytes"]["experts"]
        check((experts_bytes > 0) == ep, f"{key}: {experts_bytes} bytes of expert traffic")
        check_expert_load(key, s["train_records"])
        print(f"{key[0]} -np {np} x grad_accum {accum} (replicate {replicate}): state fingerprint "
              f"{s['state_fingerprint']}, final val loss {s['final_val_loss']!r}, bytes {s['comm_bytes']}")
    lines1, fp1, val1, load1 = seen[("matrixfsdp", 1, 1)]
    check(len(lines1) == 6, f"expected 6 loss lines, got {len(lines1)}")
    check(float(lines1[-1][1]) < float(lines1[0][1]) - 0.1, f"the loss did not fall: {lines1[0][1]} -> {lines1[-1][1]}")
    for key, (lines, fp, val, load) in seen.items():
        check(load == load1, f"{key}: expert_load differs from matrixfsdp -np 1")
        check(lines == lines1, f"{key} printed other loss lines than matrixfsdp -np 1")
        check(fp == fp1, f"{key}: state fingerprint {fp} != {fp1}")
        check(val == val1, f"{key}: final val loss {val!r} != {val1!r}")
    rc, out, s = train(bin_dir, 2, *common, "training.grad_accum=2", "model.router_aux_loss_coef=0",
                       "model.router_z_loss_coef=0")
    check(rc == 0 and s["state_fingerprint"] != fp1, "without the router losses the run ends in the same state")
    return 0


def case_resume(bin_dir, tmp):
    common = ("training.micro_batch_size=2", "training.eval_interval=6", "training.sample_tokens=0",
              "data.shuffle=true", "schedule.decay=constant")
    rc, ref_out, ref = train(bin_dir, 2, *common, "training.steps=6", "training.grad_accum=2")
    check(rc == 0, f"the uninterrupted run failed ({rc})")
    saved = {}
    for ep in ("false", "true"):
        save = os.path.join(tmp, f"save_ep_{ep}")
        rc, _, _ = train(bin_dir, 2, *common, "training.steps=3", "training.grad_accum=2", f"logging.run_dir={save}",
                         f"sharding.expert_parallel={ep}")
        check(rc == 0, f"the saving run (expert_parallel {ep}) failed ({rc})")
        saved[ep] = os.path.join(save, "checkpoints", "step_00000003")
    if not ref or rc:
        return 1
    ref_lines = [l for l in LOSS_LINE.findall(ref_out) if int(l[0]) > 3]
    check(len(ref_lines) == 3, f"expected the loss lines of steps 4-6, got {ref_lines}")
    for placement, np, accum, replicate, ep_from, ep in [("matrixfsdp", 1, 4, 1, "false", "false"),
                                                         ("fsdp2", 4, 1, 1, "false", "false"),
                                                         ("matrixfsdp", 4, 1, 2, "false", "false"),
                                                         ("matrixfsdp", 4, 1, 1, "false", "true"),
                                                         ("matrixfsdp", 1, 4, 1, "true", "false")]:
        key = (placement, np, replicate, f"expert_parallel {ep_from} -> {ep}")
        rc, out, s = train(bin_dir, np, *common, "training.steps=6", f"training.grad_accum={accum}",
                           f"sharding.placement={placement}", f"sharding.replicate={replicate}",
                           f"sharding.expert_parallel={ep}", f"training.resume={saved[ep_from]}")
        check(rc == 0 and "resumed at step 3" in out, f"{key}: resume failed ({rc})")
        if rc:
            continue
        check(LOSS_LINE.findall(out) == ref_lines, f"{key}: loss lines {LOSS_LINE.findall(out)} != {ref_lines}")
        check(s["state_fingerprint"] == ref["state_fingerprint"],
              f"{key}: state fingerprint {s['state_fingerprint']} != {ref['state_fingerprint']}")
        check(s["final_val_loss"] == ref["final_val_loss"], f"{key}: val loss {s['final_val_loss']!r} != {ref['final_val_loss']!r}")
        print(f"resumed {key}: fingerprint {s['state_fingerprint']}")
    return 0


def case_refusals(bin_dir, tmp):
    cases = [
        (("model.arch=llama", "model.num_experts=16"),
         'model.num_experts: only applies to model.arch "qwen2_moe" (model.arch is "llama")'),
        (("precision.matmul_dtype=bf16",), "precision.matmul_dtype: must not be bf16"),
        ((f"output.export={os.path.join(tmp, 'moe.safetensors')}", "model.shared_expert_intermediate_size=0"),
         "output.export: model.shared_expert_intermediate_size 0 with model.norm_topk_prob false: no Hugging Face "
         "class computes this model"),
        (("model.num_experts_per_tok=5",), "model.num_experts_per_tok: must be <= 4, got 5"),
        (("sharding.placement=fsdp2", "sharding.expert_parallel=true"),
         "sharding.expert_parallel: needs sharding.placement matrixfsdp without replicas (got fsdp2"),
    ]
    for sets, message in cases:
        rc, out, _ = train(bin_dir, 2, *sets, expect=2)
        check(rc == 2, f"{sets}: exit {rc}, expected 2")
        check(out.count(message) == 2, f"{sets}: expected the message on both ranks: {message!r}\n{out[-1500:]}")
    # a dense model has no experts to keep with their owners
    p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config",
                        os.path.join(ROOT, "configs", "tiny_test.json"), "--set", "sharding.expert_parallel=true",
                        "--set", f"logging.run_dir={os.path.join(tmp, 'dense_ep')}"],
                       env=ENV, capture_output=True, text=True, timeout=600)
    message = 'sharding.expert_parallel: needs a model with routed experts (model.arch "qwen2_moe"), got model.arch "gpt2"'
    check(p.returncode == 2 and (p.stdout + p.stderr).count(message) == 2,
          f"dense expert_parallel: exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
    return 0


if __name__ == "__main__":
    sys.exit(run_case(globals(), "mfsdp_moe"))
