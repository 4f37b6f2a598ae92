// mfsdp-bench-tokenizer: encoding speed of a tokenizer on a text file, for scripts/bench_tokenizer.py.
// threads == 1: the whole text in one encode call; threads > 1: the text's "\n\n"-separated sections
// encoded in parallel (OpenMP), as tiktoken's encode_ordinary_batch does with a thread pool. Each
// repetition loads a fresh tokenizer (cold word cache). Prints one JSON line:
// {"tokens": N, "bytes": B, "seconds": best, "threads": T}.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "apps/cli_common.h"
#include "runtime/core/file_checks.h"
#include "runtime/data/tokenizer.h"

#ifndef MFSDP_SOURCE_DIR
#define MFSDP_SOURCE_DIR "."
#endif

int main(int argc, char** argv) {
  std::string file, kind = "gpt2", path = std::string(MFSDP_SOURCE_DIR) + "/data/gpt2_tokenizer";
  int threads = 1, reps = 3;
  CLI::App app{"mfsdp-bench-tokenizer: tokens/s of a tokenizer on a text file"};
  app.add_option("file", file, "UTF-8 text")->required();
  app.add_option("--kind", kind, "gpt2 | tokenizer.json | char")->capture_default_str();
  app.add_option("--path", path, "tokenizer files (Tokenizer::load)")->capture_default_str();
  app.add_option("--threads", threads, "1: one encode call; more: sections in parallel")
      ->capture_default_str()
      ->check(CLI::Range(1, mfsdp::cli::kMaxThreads));
  app.add_option("--reps", reps, "repetitions (the best is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, mfsdp::cli::kMaxSteps));
  if (const int rc = mfsdp::cli::parse_or_exit_code(app, argc, argv); rc >= 0) return rc;
  std::string text;
  try {  // regular files only: a FIFO or a device is refused by name, never read
    text = mfsdp::read_input_file(file, "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mfsdp-bench-tokenizer: %s\n", e.what());
    return 2;
  }
  std::vector<std::string> docs;
  for (size_t pos = 0; pos < text.size();) {
    size_t at = text.find("\n\n", pos);
    at = at == std::string::npos ? text.size() : at + 2;
    docs.push_back(text.substr(pos, at - pos));
    pos = at;
  }
  double best = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < reps; ++r) {
    auto tok = mfsdp::Tokenizer::load(kind, path);
    const auto t0 = std::chrono::steady_clock::now();
    if (threads == 1) {
      tokens = tok->encode(text).size();
    } else {
      std::vector<size_t> counts(docs.size());
#pragma omp parallel for schedule(dynamic, 64) num_threads(threads)
      for (size_t d = 0; d < docs.size(); ++d) counts[d] = tok->encode(docs[d]).size();
      tokens = 0;
      for (size_t c : counts) tokens += c;
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("{\"tokens\": %zu, \"bytes\": %zu, \"seconds\": %.6f, \"threads\": %d}\n", tokens, text.size(), best,
              threads);
  return 0;
}
