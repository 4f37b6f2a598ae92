// Helpers for the data tests: a scratch directory and raw shard writers.
#pragma once
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace mfsdp::test {

/// A fresh directory under the system temp dir, removed at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  ScratchDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("mfsdp_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

/// Writes a raw file: 256 int32 header words (magic, version, ntok, then zeros) and `body` bytes.
inline void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t ntok,
                            const std::vector<uint8_t>& body) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = ntok;
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(header.data(), 4, 256, f);
  if (!body.empty()) std::fwrite(body.data(), 1, body.size(), f);
  std::fclose(f);
}

/// Tokens 0..n-1 mapped through (offset + i) % mod.
inline std::vector<uint32_t> ramp(int64_t n, uint32_t mod, uint32_t offset = 0) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>((offset + i) % mod);
  return t;
}

}  // namespace mfsdp::test
