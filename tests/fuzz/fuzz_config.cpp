// libFuzzer target: the training config (JSON with comments, schema checks, path resolution).
// Expected failures are ConfigError; anything else (crash, sanitizer report) is a bug.
#include <stdexcept>

#include "apps/train/train_config.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mfsdp::fuzz::scratch_file(data, size, "_config.json");
  try {
    const mfsdp::TrainConfig cfg = mfsdp::load_train_config(path, {"training.steps=3"});
    (void)cfg.to_json().dump();
  } catch (const mfsdp::ConfigError&) {
  }
  return 0;
}
