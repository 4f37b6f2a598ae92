// libFuzzer target: a Hugging Face checkpoint directory's config.json and
// model.safetensors.index.json (HfCheckpoint), then the config fields the importers read. The input
// is the config, optionally followed by "\n#index\n" and the index. Expected failures are
// std::runtime_error (SafetensorsError included); anything else is a bug.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "models/hf_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size), sep = "\n#index\n";
  const size_t at = text.find(sep);
  const std::filesystem::path dir = "/tmp/mfsdp_fuzz_hf_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json", std::ios::binary) << text.substr(0, at);
  if (at != std::string::npos)
    std::ofstream(dir / "model.safetensors.index.json", std::ios::binary) << text.substr(at + sep.size());
  try {
    const mfsdp::HfCheckpoint ck(dir.string());
    for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size", "num_hidden_layers", "hidden_size"})
      (void)mfsdp::hf_config_int(ck.config(), key, 1, "config.json");
    (void)mfsdp::hf_config_num(ck.config(), "rms_norm_eps", 1e-5, "config.json");
    (void)mfsdp::hf_config_bool(ck.config(), "scale_attn_weights", true, "config.json");
    (void)mfsdp::hf_config_string(ck.config(), "activation_function", "gelu_new", "config.json");
    (void)ck.names();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
