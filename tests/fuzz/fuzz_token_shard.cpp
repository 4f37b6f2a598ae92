// libFuzzer target: llm.c token-shard validation (header magic/version/count, size, token ids).
#include "fuzz_common.h"
#include "runtime/data/token_shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mfsdp::fuzz::scratch_file(data, size, "_shard.bin");
  try {
    for (const auto& info : mfsdp::validate_shards(path, 50304, 2, "two tokens")) {
      mfsdp::TokenShard shard(info.path);
      int32_t buf[2];
      shard.read(0, 2, buf);
    }
  } catch (const mfsdp::DataError&) {
  }
  return 0;
}
