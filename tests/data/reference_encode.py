#!/usr/bin/env python3
"""Reference token ids from tiktoken and Hugging Face tokenizers, for tests/data/test_tiktoken.cpp.

Builds tiktoken's "gpt2" encoding from the repository's data/gpt2_tokenizer files (offline; the
files are checked against the SHA-256 hashes tiktoken pins for GPT-2) and writes, as JSON,
{"tiktoken": {"<file>": [ids of encode_ordinary(text)], ...},
 "hf": {"<file>": [ids of tokenizers.Tokenizer.from_file(TOKENIZER_JSON).encode(text, add_special_tokens=False)]}}
("hf" only with --hf).
Usage: reference_encode.py GPT2_DIR OUT_JSON [--hf TOKENIZER_JSON] FILE...
Exit 77 when tiktoken (or, with --hf, tokenizers) is not importable.
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
    files = sys.argv[3:]
    hf_path = None
    if files[0] == "--hf":
        hf_path, files = files[1], files[2:]
    try:
        import tiktoken  # noqa: F401
        if hf_path:
            import tokenizers
    except ImportError as e:
        print(f"reference_encode.py: {e}", file=sys.stderr)
        return 77
    enc = gpt2_encoding(sys.argv[1])
    hf = tokenizers.Tokenizer.from_file(hf_path) if hf_path else None
    out = {"tiktoken": {}, "hf": {}}
    for path in files:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        out["tiktoken"][path] = enc.encode_ordinary(text)
        if hf:
            out["hf"][path] = hf.encode(text, add_special_tokens=False).ids
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
