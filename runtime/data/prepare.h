// Corpus preparation (the library behind mfsdp-prepare): text files, directories or JSONL in,
// tokenized train/val token shards out (token_shards.h format).
//
// Documents: a text file is one document, or, with doc_separator, the pieces of the file after
// splitting on that string (the separator stays at the end of each piece, as llm.c's Tiny Shakespeare
// script does; an empty last piece is dropped). A JSONL file (".jsonl", or format "jsonl") holds one
// document per non-empty line, the string field `jsonl_field` of a JSON object.
// Order: inputs in the order given; a directory contributes its regular files recursively, sorted
// by path (byte order), so the output is deterministic. The separator token (eot_token) goes
// before every document, as llm.c does. Split: the validation tokens are cut from the start or the
// end of the token stream; the rest is train. Output for prefix P: P_train.bin and P_val.bin, or,
// with shard_tokens > 0, P_train_000000.bin, P_train_000001.bin, ... (and the same for val); a char
// tokenizer built from the corpus also writes P_meta.json. Shards use uint16 tokens when the
// vocabulary has at most 65535 ids and the 32-bit variant otherwise.
// Determinism: the output is byte-identical for every thread count (documents, and for GPT-2 the
// chunks long documents are cut into, are encoded independently and concatenated in order).
// Memory: text is read in batches of about 64 MB; the token stream (4 bytes per token) is held in
// memory until written.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "runtime/data/token_shards.h"

namespace mfsdp {

/// What prepare_corpus does; see the file comment for the document model.
struct PrepareOptions {
  std::vector<std::string> inputs;  ///< text/JSONL files or directories (read recursively)
  /// "gpt2" (encoder.json + vocab.bpe under gpt2_dir), "char" (a character vocabulary built from
  /// the corpus: every distinct code point, sorted), or a path: a Hugging Face tokenizer.json
  /// (a JSON object with "model") or a char meta JSON (an object with "itos": a fixed vocabulary).
  std::string tokenizer = "gpt2";
  std::string gpt2_dir;               ///< directory with encoder.json and vocab.bpe (tokenizer "gpt2")
  std::string output_prefix;          ///< P in P_train.bin; its directory is created; must end in a name (not "dir/")
  std::string format = "auto";        ///< "auto" (".jsonl" files are JSONL), "text" or "jsonl"
  std::string jsonl_field = "text";   ///< the JSONL field holding the document text
  std::string doc_separator;          ///< split text files into documents after each occurrence ("" = no)
  /// Token placed before every document: "auto" (gpt2: "<|endoftext|>", id 50256; otherwise none),
  /// "" (none), or a token string of the tokenizer (e.g. "<|begin_of_text|>").
  std::string eot_token = "auto";
  double val_fraction = 0.1;          ///< share of tokens for validation, used when val_tokens < 0
  int64_t val_tokens = -1;            ///< exact number of validation tokens (>= 0 overrides val_fraction)
  bool val_from_start = false;        ///< validation tokens are the first ones (else the last ones)
  int64_t shard_tokens = 0;           ///< tokens per shard (0 = one file per split)
  int threads = 1;                    ///< encoding threads (1..kMaxCpuThreads); does not change the output
  bool overwrite = false;             ///< replace existing outputs (else existing outputs are an error)
};

/// What prepare_corpus wrote.
struct PrepareResult {
  std::vector<std::string> train_files, val_files;  ///< shards written (val empty when 0 val tokens)
  std::string meta_file;                            ///< char meta JSON ("" unless built)
  int64_t documents = 0, train_tokens = 0, val_tokens = 0, input_bytes = 0;
  int64_t vocab_size = 0;                           ///< the tokenizer's number of ids (model.vocab_size)
  TokenWidth width = TokenWidth::u16;
};

/// Tokenizes the corpus and writes the shards (each file via a temporary name and a rename, so an
/// interrupted run leaves no file that looks complete). Progress lines (documents, tokens, MB/s)
/// go to `progress` when it is not null. Throws DataError with the file (and line for JSONL, byte
/// offset for text) for: unreadable input, no input files, an empty corpus, invalid JSON line,
/// missing or non-string field, invalid UTF-8, a character outside a fixed char vocabulary, an
/// unknown eot_token, existing outputs without `overwrite`, bad option values.
PrepareResult prepare_corpus(const PrepareOptions& opt, std::ostream* progress = nullptr);

/// Replaces the escapes \n, \r, \t and \\ in a command-line string ("\n\n" -> two newlines).
/// Throws DataError for any other backslash escape.
std::string unescape_cli(const std::string& s);

}  // namespace mfsdp
