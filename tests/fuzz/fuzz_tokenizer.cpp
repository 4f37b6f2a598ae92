// libFuzzer target: tokenizer tables. The first byte picks the kind: even = char (meta JSON),
// odd = GPT-2 (encoder.json and vocab.bpe, split at the first NUL byte); a loaded tokenizer then
// encodes and decodes a fixed text.
#include <filesystem>
#include <stdexcept>

#include "fuzz_common.h"
#include "runtime/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool gpt2 = data[0] & 1;
  ++data;
  --size;
  std::string path;
  if (!gpt2) {
    path = mfsdp::fuzz::scratch_file(data, size, "_meta.json");
  } else {
    path = "/tmp/mfsdp_fuzz_tok_" + std::to_string(::getpid());
    std::filesystem::create_directories(path);
    size_t cut = 0;
    while (cut < size && data[cut] != 0) ++cut;
    std::filesystem::rename(mfsdp::fuzz::scratch_file(data, cut, "_enc"), path + "/encoder.json");
    const size_t rest = cut < size ? size - cut - 1 : 0;
    std::filesystem::rename(mfsdp::fuzz::scratch_file(data + cut + (cut < size), rest, "_bpe"), path + "/vocab.bpe");
  }
  try {
    auto tok = mfsdp::Tokenizer::load(gpt2 ? "gpt2" : "char", path);
    const auto ids = tok->encode("First Citizen: we are accounted poor citizens.\n");
    (void)tok->decode(ids);
  } catch (const std::runtime_error&) {  // DataError and the tokenizers' own errors
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
