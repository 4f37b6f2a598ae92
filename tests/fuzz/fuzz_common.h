// Shared helper of the libFuzzer targets: the input as a file (our parsers read files).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace mfsdp::fuzz {

/// Writes data to a per-process scratch file and returns its path.
inline std::string scratch_file(const uint8_t* data, size_t size, const char* suffix) {
  const std::string path = "/tmp/mfsdp_fuzz_" + std::to_string(::getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return path;
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace mfsdp::fuzz
