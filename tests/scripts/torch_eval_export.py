#!/usr/bin/python3
"""Mean cross-entropy of an exported MatrixFSDP model on one batch of an llm.c token shard.

usage: torch_eval_export.py MODEL.safetensors SHARD.bin --batch B --seq T [--offset N]

MODEL is a single safetensors file in the Hugging Face GPT-2 layout (names as in
models/gpt_spec.h, an optional "transformer." prefix is accepted; c_attn/c_proj/c_fc weights as
Conv1D [in, out]; wte and lm_head [vocab_size, C]); the config comes from its __metadata__ keys
n_layer, n_head, n_embd, seq_len, vocab_size, tie_embeddings. The script reads B*T+1 tokens from
SHARD starting at token N (default 0): inputs are tokens[0:B*T] viewed as [B, T], targets
tokens[1:B*T+1]. It prints one line `{"loss": <float>}` (fp32 loss, exact decimal of the float)
and exits 0; on bad input it prints the error to stderr and exits 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import gpt2_torch as g  # noqa: E402


def eval_loss(model_path: str, shard_path: str, batch: int, seq: int, offset: int = 0) -> float:
    """Returns the fp32 mean cross-entropy (as a Python float) of the model on one batch.

    Raises ValueError on a bad model file, a bad shard, B/T out of range, or token ids
    >= vocab_size (naming the token offset).
    """
    if batch < 1 or seq < 1:
        raise ValueError(f"[torch_eval_export] --batch and --seq must be >= 1, got {batch}, {seq}")
    params, cfg = g.load_hf(model_path)
    if seq > cfg.seq_len:
        raise ValueError(f"[torch_eval_export] --seq {seq} exceeds the model's seq_len "
                         f"{cfg.seq_len}")
    toks = g.read_token_window(shard_path, offset, batch * seq + 1)
    bad = (toks >= cfg.vocab_size).nonzero()[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"[torch_eval_export] {shard_path}: token {int(toks[i])} at offset "
                         f"{offset + i} is >= vocab_size {cfg.vocab_size}")
    t = torch.from_numpy(toks)
    x = t[:-1].reshape(batch, seq)
    y = t[1:].reshape(batch, seq)
    with torch.no_grad():
        loss = g.loss_from_logits(g.forward(params, cfg, x), y, cfg.vocab_size)
    return float(loss.item())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="model .safetensors in the HF GPT-2 layout")
    ap.add_argument("shard", help="llm.c token shard (.bin)")
    ap.add_argument("--batch", type=int, required=True, help="batch size B")
    ap.add_argument("--seq", type=int, required=True, help="sequence length T")
    ap.add_argument("--offset", type=int, default=0, help="first token to read (default 0)")
    args = ap.parse_args(argv)
    g.setup_determinism()
    try:
        loss = eval_loss(args.model, args.shard, args.batch, args.seq, args.offset)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"loss": loss}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
