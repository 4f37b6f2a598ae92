// libFuzzer target: the safetensors reader (header JSON, offsets, dtypes), then every tensor read.
#include "checkpoint/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mfsdp::fuzz::scratch_file(data, size, ".safetensors");
  try {
    mfsdp::SafetensorsFile f(path);
    for (const std::string& name : f.names()) {
      const auto& info = f.info(name);
      (void)f.raw(name);
      if (info.dtype == "F32" || info.dtype == "BF16" || info.dtype == "F16") (void)f.read_f32(name);
    }
    (void)f.metadata();
  } catch (const mfsdp::SafetensorsError&) {
  }
  return 0;
}
