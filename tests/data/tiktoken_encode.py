#!/usr/bin/env python3
"""Reference GPT-2 token ids from tiktoken, for tests/data/test_tiktoken.cpp and the tokenizer benchmark.

Builds tiktoken's "gpt2" encoding from the repository's data/gpt2_tokenizer files (offline; the
files are checked against the SHA-256 hashes tiktoken pins for GPT-2) and writes, as JSON,
{"<file>": [ids of tiktoken encode_ordinary(file text)], ...}.
Usage: tiktoken_encode.py GPT2_DIR OUT_JSON FILE...    Exit 77 when tiktoken is not importable.
"""
import json
import os
import sys


def gpt2_encoding(gpt2_dir):
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext import openai_public

    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=os.path.join(gpt2_dir, "vocab.bpe"),
        encoder_json_file=os.path.join(gpt2_dir, "encoder.json"),
        vocab_bpe_hash="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        encoder_json_hash="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    )
    return tiktoken.Encoding(name="gpt2-local", pat_str=openai_public.r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import tiktoken  # noqa: F401
    except ImportError as e:
        print(f"tiktoken_encode.py: tiktoken is not available ({e})", file=sys.stderr)
        return 77
    enc = gpt2_encoding(sys.argv[1])
    out = {}
    for path in sys.argv[3:]:
        with open(path, "rb") as f:
            out[path] = enc.encode_ordinary(f.read().decode("utf-8"))
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
