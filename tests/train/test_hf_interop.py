#!/usr/bin/env python3
"""Hugging Face interoperability of mfsdp-train, checked with the real `transformers` library.

usage: test_hf_interop.py BIN_DIR CASE   with CASE one of
  export   GPT-2, Llama, Qwen2-MoE and Mixtral trained a few steps at world 2 and exported as a directory
           (output.export without .safetensors): config.json + model.safetensors load with
           AutoModelForCausalLM.from_pretrained, with no missing or unexpected keys, and reproduce
           our --eval-only loss within 1e-4
  import   small random GPT2LMHeadModel / LlamaForCausalLM made by transformers itself and saved with
           save_pretrained (plain and sharded with max_shard_size, GQA for Llama) are read by
           model.init_from: --eval-only reproduces transformers' loss within 1e-4; training continues
           from the sharded Llama and its export loads back into transformers; a Qwen2MoeForCausalLM
           (renormalised top-k) and a MixtralForCausalLM likewise, refused when an attention bias is
           nonzero; an MoE no Hugging Face class computes (no shared expert, no renormalisation) is refused
Needs torch, numpy and transformers: the test virtual environment (scripts/test_venv.sh) is used
when the running interpreter lacks them; without it the case exits 77 (skipped).
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VENV_PY = os.path.join(ROOT, ".venv-test", "bin", "python")
try:
    import numpy as np
    import torch
    import transformers
except ImportError as e:
    if os.path.exists(VENV_PY) and not os.environ.get("MFSDP_HF_REEXEC"):
        os.environ["MFSDP_HF_REEXEC"] = "1"
        os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__), *sys.argv[1:]])
    print(f"SKIP: torch/transformers not importable ({e}); run scripts/test_venv.sh")
    sys.exit(77)

sys.path.insert(0, HERE)
from cli_common import ENV, TINY, check, run_case  # noqa: E402

T, V, SEQS = 32, 65, 4  # tiny_test.json: context 32, character vocabulary
LLAMA_SETS = ["model.arch=llama", "model.n_kv_head=1", "model.intermediate_size=96"]
# tiny_test.json as a Mixture of Experts: 4 experts of 16, top 2, a shared expert of 24
MOE_SETS = ["model.arch=qwen2_moe", "model.n_kv_head=1", "model.num_experts=4", "model.num_experts_per_tok=2",
            "model.moe_intermediate_size=16", "model.shared_expert_intermediate_size=24"]
# the same without a shared expert, top-k weights renormalised: Mixtral's layout
MIXTRAL_SETS = ["model.arch=qwen2_moe", "model.n_kv_head=1", "model.num_experts=4", "model.num_experts_per_tok=2",
                "model.moe_intermediate_size=16", "model.norm_topk_prob=true"]
LOSS_RE = re.compile(r"validation loss ([0-9.]+) over (\d+) sequences")


def write_val_shard(path, seed):
    """SEQS * T + 1 random tokens as an llm.c shard (uint16, 256 x int32 header)."""
    toks = np.random.default_rng(seed).integers(0, V, SEQS * T + 1)
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, 1, toks.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u2").tobytes())
    return toks


def mfsdp(bin_dir, tmp, name, *sets, args=()):
    cmd = ["mpirun", "-np", "2", "--oversubscribe", os.path.join(bin_dir, "mfsdp-train"), "--config", TINY, *args,
           "--set", f"logging.run_dir={os.path.join(tmp, 'run_' + name)}", "--set", "training.sample_tokens=0",
           "--set", "checkpoint.at_end=false"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        print(out[-3000:])
    return p.returncode, out


def our_eval_loss(bin_dir, tmp, name, model_dir, val, *sets):
    rc, out = mfsdp(bin_dir, tmp, name, f"model.init_from={model_dir}", f"data.val={val}", *sets, args=("--eval-only",))
    m = LOSS_RE.search(out)
    check(rc == 0 and m is not None, f"{name}: --eval-only failed (rc {rc}): {out[-600:]}")
    if not m:
        return None
    check(int(m.group(2)) == SEQS, f"{name}: evaluated {m.group(2)} sequences, expected {SEQS}")
    return float(m.group(1))


def hf_loss(model_dir, toks):
    """Mean next-token cross-entropy of transformers' model over SEQS windows of T+1 tokens; the
    load must find every tensor it expects and no other."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32,
                                                                    attn_implementation="eager",
                                                                    output_loading_info=True)
    model.eval()
    check(not info["missing_keys"] and not info["unexpected_keys"], f"{model_dir}: loading info {info}")
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(SEQS):
            w = torch.tensor(toks[i * T:i * T + T + 1], dtype=torch.long)
            logits = model(w[None, :T]).logits[0].double()
            total += torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum").item()
            count += T
    return total / count


def compare(name, ours, theirs):
    print(f"{name}: mfsdp-train {ours}, transformers {theirs:.6f}")
    check(ours is not None and abs(ours - theirs) <= 1e-4, f"{name}: loss {ours} vs transformers {theirs:.6f}")


def case_export(bin_dir, tmp):
    val = os.path.join(tmp, "val.bin")
    toks = write_val_shard(val, 1)
    for arch, sets, hf_class in (("gpt2", [], "GPT2LMHeadModel"), ("gpt2_untied", ["model.tie_embeddings=false"], "GPT2LMHeadModel"),
                                 ("llama", LLAMA_SETS, "LlamaForCausalLM"), ("moe", MOE_SETS, "Qwen2MoeForCausalLM"),
                                 ("mixtral", MIXTRAL_SETS, "MixtralForCausalLM")):
        out_dir = os.path.join(tmp, f"{arch}_hf")
        rc, out = mfsdp(bin_dir, tmp, f"train_{arch}", "training.steps=40", f"output.export={out_dir}", *sets)
        check(rc == 0, f"{arch}: training failed (rc {rc})")
        if rc != 0:
            continue
        names = sorted(os.listdir(out_dir))
        check(names == ["config.json", "model.safetensors"], f"{arch}: export directory holds {names}")
        cfg = json.load(open(os.path.join(out_dir, "config.json")))
        check(cfg.get("architectures") == [hf_class], f"{arch}: config.json architectures {cfg.get('architectures')}")
        compare(f"export {arch}", our_eval_loss(bin_dir, tmp, f"eval_{arch}", out_dir, val, *sets), hf_loss(out_dir, toks))


def spread_norm_gains(model):
    """RMSNorm gains moved away from 1, so that a wrong norm would show in the loss."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))


def save_hf_models(tmp):
    """Random models made and saved by transformers itself (not by our code)."""
    torch.manual_seed(0)
    gpt_cfg = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                      initializer_range=0.2, tie_word_embeddings=True)
    llama_cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T,
                                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                                         initializer_range=0.2)
    dirs = {}
    gpt = transformers.GPT2LMHeadModel(gpt_cfg)
    dirs["gpt2"] = os.path.join(tmp, "hf_gpt2")
    gpt.save_pretrained(dirs["gpt2"])
    dirs["gpt2_sharded"] = os.path.join(tmp, "hf_gpt2_sharded")
    gpt.save_pretrained(dirs["gpt2_sharded"], max_shard_size="20KB")
    llama = transformers.LlamaForCausalLM(llama_cfg)
    spread_norm_gains(llama)
    dirs["llama_sharded"] = os.path.join(tmp, "hf_llama_sharded")
    llama.save_pretrained(dirs["llama_sharded"], max_shard_size="20KB")
    moe_cfg = transformers.Qwen2MoeConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=1, max_position_embeddings=T, rms_norm_eps=1e-5,
                                          rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2,
                                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                          shared_expert_intermediate_size=24, intermediate_size=24,
                                          norm_topk_prob=True, use_sliding_window=False)
    moe = transformers.Qwen2MoeForCausalLM(moe_cfg)
    spread_norm_gains(moe)
    dirs["moe_sharded"] = os.path.join(tmp, "hf_moe_sharded")
    moe.save_pretrained(dirs["moe_sharded"], max_shard_size="20KB")
    with torch.no_grad():  # Qwen2-MoE's attention biases, which our family does not have
        moe.model.layers[1].self_attn.k_proj.bias.fill_(0.5)
    dirs["moe_biased"] = os.path.join(tmp, "hf_moe_biased")
    moe.save_pretrained(dirs["moe_biased"])
    mixtral_cfg = transformers.MixtralConfig(vocab_size=V, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T,
                                             rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                                             initializer_range=0.2, num_local_experts=4, num_experts_per_tok=2)
    mixtral = transformers.MixtralForCausalLM(mixtral_cfg)
    spread_norm_gains(mixtral)
    dirs["mixtral_sharded"] = os.path.join(tmp, "hf_mixtral_sharded")
    mixtral.save_pretrained(dirs["mixtral_sharded"], max_shard_size="20KB")
    for k in ("gpt2_sharded", "llama_sharded", "moe_sharded", "mixtral_sharded"):
        check(os.path.exists(os.path.join(dirs[k], "model.safetensors.index.json")), f"{k}: transformers did not shard")
    return dirs


def case_import(bin_dir, tmp):
    val = os.path.join(tmp, "val.bin")
    toks = write_val_shard(val, 2)
    dirs = save_hf_models(tmp)
    moe_import = MOE_SETS + ["model.norm_topk_prob=true"]
    for name in ("gpt2", "gpt2_sharded", "llama_sharded", "moe_sharded", "mixtral_sharded"):
        sets = {"llama": LLAMA_SETS, "moe": moe_import, "mixtral": MIXTRAL_SETS}.get(name.split("_")[0], [])
        theirs = hf_loss(dirs[name], toks)
        check(theirs > 4.4, f"{name}: transformers' loss {theirs:.4f} is too close to uniform to tell models apart")
        compare(f"import {name}", our_eval_loss(bin_dir, tmp, f"eval_{name}", dirs[name], val, *sets), theirs)
    # a config that does not match the checkpoint is refused naming the field and the key
    rc, out = mfsdp(bin_dir, tmp, "bad_kv", f"model.init_from={dirs['llama_sharded']}", f"data.val={val}",
                    "model.arch=llama", "model.intermediate_size=96", args=("--eval-only",))
    check(rc == 2 and "num_key_value_heads" in out and "model.n_kv_head" in out, f"kv-head mismatch: rc {rc}: {out[-400:]}")
    rc, out = mfsdp(bin_dir, tmp, "moe_biased", f"model.init_from={dirs['moe_biased']}", f"data.val={val}", *moe_import,
                    args=("--eval-only",))
    check(rc != 0 and "model.layers.1.self_attn.k_proj.bias: holds nonzero values" in out,
          f"a nonzero attention bias: rc {rc}: {out[-400:]}")
    rc, out = mfsdp(bin_dir, tmp, "moe_topk", f"model.init_from={dirs['moe_sharded']}", f"data.val={val}", *MOE_SETS,
                    args=("--eval-only",))
    check(rc == 2 and "norm_topk_prob is true but model.norm_topk_prob is false" in out,
          f"norm_topk_prob mismatch: rc {rc}: {out[-400:]}")
    # without a shared expert and without renormalised weights no Hugging Face class fits: refused, naming both
    rc, out = mfsdp(bin_dir, tmp, "moe_no_layout", f"output.export={os.path.join(tmp, 'never')}", "training.steps=1",
                    *MIXTRAL_SETS[:-1])
    check(rc == 2 and "Qwen2-MoE (Qwen2MoeForCausalLM) always has a shared expert" in out and "Mixtral" in out,
          f"an MoE no layout fits: rc {rc}: {out[-400:]}")
    # continue training public weights, export, load back
    out_dir = os.path.join(tmp, "llama_continued")
    rc, out = mfsdp(bin_dir, tmp, "continue", f"model.init_from={dirs['llama_sharded']}", "training.steps=5",
                    f"output.export={out_dir}", f"data.val={val}", *LLAMA_SETS)
    check(rc == 0, f"training from the sharded Llama failed (rc {rc})")
    if rc == 0:
        compare("continued llama", our_eval_loss(bin_dir, tmp, "eval_continued", out_dir, val, *LLAMA_SETS),
                hf_loss(out_dir, toks))


if __name__ == "__main__":
    sys.exit(run_case(globals(), "hf"))
