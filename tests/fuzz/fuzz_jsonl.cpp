// libFuzzer target: mfsdp-prepare's JSONL reader (one document per line, the "text" field) through
// prepare_corpus with a char vocabulary built from the corpus, outputs in a scratch directory.
// Expected failures are DataError (invalid JSON, missing or non-string field, invalid UTF-8, an
// empty corpus); anything else is a bug.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "fuzz_common.h"
#include "runtime/data/prepare.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mfsdp::PrepareOptions opt;
  opt.inputs = {mfsdp::fuzz::scratch_file(data, size, "_docs.jsonl")};
  opt.tokenizer = "char";
  opt.val_tokens = 1;
  opt.overwrite = true;
  opt.output_prefix = "/tmp/mfsdp_fuzz_jsonl_" + std::to_string(::getpid()) + "/p";
  try {
    (void)mfsdp::prepare_corpus(opt);
  } catch (const mfsdp::DataError&) {
  }
  return 0;
}
