// Token shards in the llm.c format: validation, memory-mapped reading, writing.
//
// File layout (little-endian):
//   header: 256 x int32 = 1024 bytes: [0] magic, [1] version (1), [2] ntok (number of tokens),
//           the remaining 253 entries are reserved (written as 0, not checked);
//   body:   ntok tokens, uint16 (magic 20240520, llm.c's format) or uint32 (magic 20240801, our
//           32-bit variant for vocabularies >= 65536); file size == 1024 + width * ntok exactly.
// A 16-bit shard can only serve vocab_size <= 65535 (vocabularies >= 65536
// need the 32-bit variant); a 32-bit shard serves vocab_size <= 2^31 - 1 (tokens are int32 in memory).
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mfsdp {

class SwapFile;  // runtime/core/file_checks.h

/// Any problem with token data (missing files, bad header, size, token ids, too short).
/// Messages name the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int32_t kShardMagicU16 = 20240520;  ///< llm.c: uint16 tokens
inline constexpr int32_t kShardMagicU32 = 20240801;  ///< ours: uint32 tokens
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderBytes = 1024;
inline constexpr int64_t kMaxVocabU16 = 65535;       ///< largest vocab_size a 16-bit shard serves
inline constexpr int64_t kMaxVocabU32 = 2147483647;  ///< largest vocab_size a 32-bit shard serves

/// Token width of a shard in bytes: 2 (uint16) or 4 (uint32).
enum class TokenWidth : int { u16 = 2, u32 = 4 };

/// The shard format a vocabulary needs: u16 when vocab_size <= 65535, u32 up to 2^31-1.
/// Throws DataError when vocab_size < 1 or > kMaxVocabU32.
TokenWidth shard_width_for_vocab(int64_t vocab_size);

/// Sorted list of files matching a glob pattern (glob(3); a plain path matches itself).
/// Throws DataError("[expand_glob] no file matches '<pattern>'") when nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

/// A read-only memory-mapped shard with a validated header and size. Move-only.
class TokenShard {
 public:
  /// Maps `path` and checks magic, version, ntok >= 0 and the exact file size.
  /// Throws DataError naming the file and the mismatch.
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&&) noexcept;
  TokenShard& operator=(TokenShard&&) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  TokenWidth width() const { return width_; }
  int64_t num_tokens() const { return ntok_; }
  /// Token at index i (0 <= i < num_tokens(); unchecked).
  uint32_t token(int64_t i) const;
  /// Copies tokens [offset, offset+count) to out as int32; throws DataError when out of range.
  void read(int64_t offset, int64_t count, int32_t* out) const;
  /// Largest token id and its index (scans the body); {-1, -1} for an empty shard.
  std::pair<int64_t, int64_t> max_token() const;
  /// Throws DataError naming the file, token index and byte offset of the first id >= vocab_size.
  /// Also refuses a 16-bit shard for vocab_size > kMaxVocabU16.
  void check_vocab(int64_t vocab_size) const;

 private:
  std::string path_;
  TokenWidth width_ = TokenWidth::u16;
  int64_t ntok_ = 0;
  const uint8_t* map_ = nullptr;  // whole file
  int64_t map_bytes_ = 0;
};

/// What validate_shards learned about one shard.
struct ShardInfo {
  std::string path;
  TokenWidth width = TokenWidth::u16;
  int64_t num_tokens = 0;
};

/// Expands `glob` (sorted) and validates every shard: header, exact size, vocabulary fits the
/// format, every token id < vocab_size, and num_tokens >= min_tokens (e.g. one global batch,
/// W*A*B*T + 1 tokens). Throws DataError naming the file and the problem, e.g.
/// "[validate_shards] data/x.bin: 1000 tokens, one global batch needs 1537 (B*T*grad_accum*world + 1)".
/// Every rank calls this before any collective. `what_min` describes min_tokens in the message.
std::vector<ShardInfo> validate_shards(const std::string& glob, int64_t vocab_size,
                                       int64_t min_tokens = 1,
                                       const std::string& what_min = "one global batch");

/// Writes a shard (a SwapFile: a fresh temporary beside it, every write checked, then a rename).
/// Tokens must fit `width` (throws DataError otherwise, and naming the file on a failed write).
/// Used by tests and the prepare tool.
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       TokenWidth width = TokenWidth::u16);

/// Writes a whole shard into `out` and finishes it (complete and fsync'ed, not yet renamed: the
/// caller commits). Same checks and errors as write_token_shard. mfsdp-prepare stages its outputs so.
void write_token_shard_to(SwapFile& out, const std::vector<uint32_t>& tokens, TokenWidth width);

}  // namespace mfsdp
