// Helpers for the data tests: a scratch directory and raw shard writers.
#pragma once
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
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

/// The whole contents of a file ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A Hugging Face tokenizer.json holding GPT-2's vocabulary and merges with the given pre_tokenizer
/// (data_dir: the repository's data/ holding gpt2_tokenizer/).
inline nlohmann::json gpt2_as_tokenizer_json(const std::string& data_dir, const nlohmann::json& pre_tokenizer,
                                             bool merges_as_pairs) {
  nlohmann::json j;
  j["version"] = "1.0";
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = pre_tokenizer;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["post_processor"] = nullptr;
  j["added_tokens"] = nlohmann::json::array({{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false},
                                              {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                              {"special", true}}});
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false}};
  j["model"]["vocab"] = nlohmann::json::parse(slurp(data_dir + "/gpt2_tokenizer/encoder.json"));
  std::istringstream bpe(slurp(data_dir + "/gpt2_tokenizer/vocab.bpe"));
  nlohmann::json merges = nlohmann::json::array();
  for (std::string line; std::getline(bpe, line);) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    if (merges_as_pairs) merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
    else merges.push_back(line);
  }
  j["model"]["merges"] = merges;
  return j;
}

/// Writes `text` to `path`, creating its parent directories.
inline void put(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace mfsdp::test
