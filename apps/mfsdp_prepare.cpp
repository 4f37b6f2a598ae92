// mfsdp-prepare: tokenize text files, directories or JSONL into train/val token shards for
// mfsdp-train. The logic lives in runtime/data/prepare.h; this is the command line.
//   mfsdp-prepare corpus/ -o data/mine                       GPT-2, 10% val at the end
//   mfsdp-prepare notes.txt --tokenizer char -o data/notes   char vocabulary + data/notes_meta.json
// Exit codes: 0 written, 2 bad input or options (the message names the file and line).
#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <iostream>

#include "apps/cli_common.h"
#include "runtime/core/utf8.h"
#include "runtime/data/prepare.h"

#ifndef MFSDP_SOURCE_DIR
#define MFSDP_SOURCE_DIR "."
#endif

int main(int argc, char** argv) {
  mfsdp::PrepareOptions opt;
  opt.gpt2_dir = std::string(MFSDP_SOURCE_DIR) + "/data/gpt2_tokenizer";
  std::string separator, val_from = "end";
  bool no_eot = false, quiet = false;
  CLI::App app{"mfsdp-prepare: tokenize text into llm.c token shards (P_train.bin, P_val.bin)"};
  app.add_option("inputs", opt.inputs, "text files, JSONL files (.jsonl) or directories (recursive, sorted)")
      ->required();
  app.add_option("-o,--output", opt.output_prefix, "output prefix P: writes P_train.bin, P_val.bin (directory created)")
      ->required();
  app.add_option("--tokenizer", opt.tokenizer,
                 "gpt2 | char (vocabulary built from the corpus, writes P_meta.json) | path to a tokenizer.json "
                 "or to a char meta JSON")
      ->capture_default_str();
  app.add_option("--gpt2-dir", opt.gpt2_dir, "directory with encoder.json and vocab.bpe")->capture_default_str();
  app.add_option("--format", opt.format, "auto (.jsonl files are JSONL) | text | jsonl")->capture_default_str();
  app.add_option("--jsonl-field", opt.jsonl_field, "JSONL field holding the text")->capture_default_str();
  app.add_option("--doc-separator", separator,
                 "split text files into documents after each occurrence of this string (escapes \\n \\r \\t \\\\)");
  app.add_option("--eot-token", opt.eot_token,
                 "token before every document: auto (gpt2: <|endoftext|> = 50256, others: none) or a token string")
      ->capture_default_str();
  app.add_flag("--no-eot", no_eot, "no token between documents");
  auto* vf = app.add_option("--val-fraction", opt.val_fraction, "share of tokens for validation, in [0, 1)")
                 ->capture_default_str()
                 ->check(CLI::Range(0.0, 1.0));
  app.add_option("--val-tokens", opt.val_tokens, "exact number of validation tokens")
      ->excludes(vf)
      ->check(CLI::Range(int64_t{0}, int64_t{INT64_MAX}));
  app.add_option("--val-from", val_from, "where the validation tokens are cut: start | end")
      ->check(CLI::IsMember({"start", "end"}))
      ->capture_default_str();
  app.add_option("--shard-tokens", opt.shard_tokens, "tokens per shard, 0 = one file per split (P_train_000000.bin ...)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{INT32_MAX}));
  app.add_option("--threads", opt.threads, "encoding threads (the output does not depend on it)")
      ->capture_default_str()
      ->check(CLI::Range(1, mfsdp::cli::kMaxThreads));
  app.add_flag("--overwrite", opt.overwrite, "replace existing outputs of this prefix");
  app.add_flag("-q,--quiet", quiet, "no progress lines");
  if (const int rc = mfsdp::cli::parse_or_exit_code(app, argc, argv); rc >= 0) return rc;
  try {
    if (!separator.empty()) opt.doc_separator = mfsdp::unescape_cli(separator);
    if (no_eot) opt.eot_token = "";
    opt.val_from_start = val_from == "start";
    const auto r = mfsdp::prepare_corpus(opt, quiet ? nullptr : &std::cerr);
    std::printf("mfsdp-prepare: %lld documents, %lld bytes -> %lld train + %lld val tokens (vocab_size %lld, %s shards)\n",
                static_cast<long long>(r.documents), static_cast<long long>(r.input_bytes),
                static_cast<long long>(r.train_tokens), static_cast<long long>(r.val_tokens),
                static_cast<long long>(r.vocab_size), r.width == mfsdp::TokenWidth::u16 ? "uint16" : "uint32");
    for (const auto& f : r.train_files) std::printf("  train %s\n", f.c_str());
    for (const auto& f : r.val_files) std::printf("  val   %s\n", f.c_str());
    if (!r.meta_file.empty()) std::printf("  meta  %s\n", r.meta_file.c_str());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "[mfsdp-prepare] out of memory: the token stream (4 bytes per token) does not fit; "
                         "split the corpus into several runs\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", mfsdp::escape_invalid_utf8(e.what()).c_str());  // a file name may hold any bytes
    return 2;
  }
  return 0;
}
