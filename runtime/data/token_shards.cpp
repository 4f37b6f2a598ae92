#include "runtime/data/token_shards.h"

#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace mfsdp {

namespace {

std::string errno_text() { return std::strerror(errno); }

int32_t read_i32_le(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // the project targets little-endian hosts (x86-64, aarch64)
  return v;
}

}  // namespace

TokenWidth shard_width_for_vocab(int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > kMaxVocabU32)
    throw DataError("[shard_width_for_vocab] vocab_size " + std::to_string(vocab_size) +
                    " does not fit any shard format (max " + std::to_string(kMaxVocabU32) + ")");
  return vocab_size <= kMaxVocabU16 ? TokenWidth::u16 : TokenWidth::u32;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  if (pattern.empty()) throw DataError("[expand_glob] empty shard pattern");
  struct stat literal{};
  if (::stat(pattern.c_str(), &literal) == 0 && S_ISREG(literal.st_mode))
    return {pattern};  // an existing file is itself, even when its name holds *, ? or [
  glob_t g{};
  int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty()))
    throw DataError("[expand_glob] no file matches '" + clip_for_message(pattern, 300) + "'");
  if (rc != 0) throw DataError("[expand_glob] cannot read the directory of '" + clip_for_message(pattern, 300) + "'");
  std::sort(out.begin(), out.end());
  return out;
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  const int fd = open_input_file<DataError>(path, "[token shard]");  // a FIFO is refused, never waited on
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    std::string e = errno_text();
    ::close(fd);
    throw DataError("[token shard] " + path + ": cannot stat: " + e);
  }
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    throw DataError("[token shard] " + path + ": file has " + std::to_string(size) +
                    " bytes, shorter than the 1024-byte header (not a token shard?)");
  }
  void* m = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw DataError("[token shard] " + path + ": mmap failed: " + errno_text());
  map_ = static_cast<const uint8_t*>(m);
  map_bytes_ = size;
  try {
    const int32_t magic = read_i32_le(map_), version = read_i32_le(map_ + 4);
    const int64_t ntok = read_i32_le(map_ + 8);
    if (magic == kShardMagicU16) {
      width_ = TokenWidth::u16;
    } else if (magic == kShardMagicU32) {
      width_ = TokenWidth::u32;
    } else {
      throw DataError("[token shard] " + path + ": bad magic " + std::to_string(magic) +
                      " (expected " + std::to_string(kShardMagicU16) + " for uint16 tokens or " +
                      std::to_string(kShardMagicU32) +
                      " for uint32 tokens); is this an llm.c token shard?");
    }
    if (version != kShardVersion)
      throw DataError("[token shard] " + path + ": unsupported version " + std::to_string(version) +
                      " (expected " + std::to_string(kShardVersion) + ")");
    if (ntok < 0)
      throw DataError("[token shard] " + path + ": negative token count " + std::to_string(ntok));
    const int64_t expect = kShardHeaderBytes + static_cast<int64_t>(width_) * ntok;
    if (size != expect)
      throw DataError("[token shard] " + path + ": header says " + std::to_string(ntok) + " tokens (" +
                      std::to_string(expect) + " bytes) but the file has " + std::to_string(size) +
                      " bytes (" + (size < expect ? "truncated" : "trailing bytes") + ")");
    ntok_ = ntok;
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(map_bytes_));
    map_ = nullptr;
    throw;
  }
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(map_bytes_));
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)), width_(o.width_), ntok_(o.ntok_), map_(o.map_), map_bytes_(o.map_bytes_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), static_cast<size_t>(map_bytes_));
    path_ = std::move(o.path_);
    width_ = o.width_;
    ntok_ = o.ntok_;
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
  }
  return *this;
}

uint32_t TokenShard::token(int64_t i) const {
  const uint8_t* body = map_ + kShardHeaderBytes;
  if (width_ == TokenWidth::u16) {
    uint16_t v;
    std::memcpy(&v, body + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, body + 4 * i, 4);
  return v;
}

void TokenShard::read(int64_t offset, int64_t count, int32_t* out) const {
  if (offset < 0 || count < 0 || offset + count > ntok_)
    throw DataError("[token shard read] " + path_ + ": tokens [" + std::to_string(offset) + ", " +
                    std::to_string(offset + count) + ") out of range, shard has " +
                    std::to_string(ntok_));
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(token(offset + i));
}

std::pair<int64_t, int64_t> TokenShard::max_token() const {
  int64_t best = -1, at = -1;
  for (int64_t i = 0; i < ntok_; ++i) {
    const int64_t t = token(i);
    if (t > best) {
      best = t;
      at = i;
    }
  }
  return {best, at};
}

void TokenShard::check_vocab(int64_t vocab_size) const {
  if (width_ == TokenWidth::u16 && vocab_size > kMaxVocabU16)
    throw DataError("[token shard] " + path_ + ": vocab_size " + std::to_string(vocab_size) +
                    " does not fit the 16-bit shard format (max " + std::to_string(kMaxVocabU16) +
                    "); write 32-bit shards (magic " + std::to_string(kShardMagicU32) + ")");
  if (vocab_size < 1 || vocab_size > kMaxVocabU32)
    throw DataError("[token shard] " + path_ + ": vocab_size " + std::to_string(vocab_size) +
                    " does not fit the 32-bit shard format (max " + std::to_string(kMaxVocabU32) + ")");
  for (int64_t i = 0; i < ntok_; ++i) {
    const int64_t t = token(i);
    if (t >= vocab_size)
      throw DataError("[token shard] " + path_ + ": token id " + std::to_string(t) + " at token " +
                      std::to_string(i) + " (byte offset " +
                      std::to_string(kShardHeaderBytes + static_cast<int64_t>(width_) * i) +
                      ") is >= vocab_size " + std::to_string(vocab_size));
  }
}

std::vector<ShardInfo> validate_shards(const std::string& glob, int64_t vocab_size, int64_t min_tokens,
                                       const std::string& what_min) {
  std::vector<ShardInfo> out;
  for (const std::string& path : expand_glob(glob)) {
    TokenShard s(path);
    if (s.num_tokens() < min_tokens)
      throw DataError("[validate_shards] " + path + ": has " + std::to_string(s.num_tokens()) +
                      " tokens, " + what_min + " needs " + std::to_string(min_tokens));
    s.check_vocab(vocab_size);
    out.push_back(ShardInfo{path, s.width(), s.num_tokens()});
  }
  return out;
}

void write_token_shard_to(SwapFile& out, const std::vector<uint32_t>& tokens, TokenWidth width) {
  const std::string& path = out.path();
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw DataError("[write_token_shard] " + path + ": " + std::to_string(tokens.size()) +
                    " tokens exceed the header's int32 count; split into several shards");
  std::vector<int32_t> header(256, 0);
  header[0] = width == TokenWidth::u16 ? kShardMagicU16 : kShardMagicU32;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::vector<uint8_t> body(tokens.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = tokens[i];
    if (width == TokenWidth::u16) {
      if (t > 0xffffu)
        throw DataError("[write_token_shard] " + path + ": token " + std::to_string(t) + " at " +
                        std::to_string(i) + " does not fit uint16; use the 32-bit format");
      const uint16_t v = static_cast<uint16_t>(t);
      std::memcpy(body.data() + 2 * i, &v, 2);
    } else {
      std::memcpy(body.data() + 4 * i, &t, 4);
    }
  }
  try {
    out.write(header.data(), header.size() * 4);
    out.write(body.data(), body.size());
    out.finish();
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(std::string("[write_token_shard] ") + e.what());
  }
}

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens, TokenWidth width) {
  try {
    SwapFile out(path);  // a fresh name: never a file of the user's
    write_token_shard_to(out, tokens, width);
    out.commit();
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(std::string("[write_token_shard] ") + e.what());
  }
}

}  // namespace mfsdp
