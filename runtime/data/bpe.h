// Byte-level BPE (GPT-2 and Hugging Face tokenizer.json BPE models): a PCRE2 pre-tokenizer, ranked
// merges applied leftmost-lowest-rank first (as tiktoken and Hugging Face tokenizers do), and a
// per-thread cache of the ids of every pre-token word already encoded.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/data/tokenizer.h"

namespace mfsdp {

/// GPT-2's pre-tokenizer pattern (PCRE2 syntax; `\s` is widened to Unicode White_Space, see
/// ByteLevelBpeSpec::pattern).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// Everything a byte-level BPE tokenizer needs, in raw bytes (the byte-level alphabet already undone).
struct ByteLevelBpeSpec {
  std::string kind;     ///< Tokenizer::kind() ("gpt2", "tokenizer.json")
  std::string source;   ///< file named in error messages
  /// Pre-tokenizer regex, compiled by PCRE2 with UTF and UCP (JIT when available). Text between
  /// matches (none for GPT-2's pattern) becomes a piece of its own, as Hugging Face's Split(Isolated)
  /// does. `\s` and `\S` are rewritten to also cover U+0085, so `\s` is Unicode White_Space as in
  /// tiktoken and Hugging Face tokenizers (PCRE2's UCP `\s` leaves U+0085 out).
  std::string pattern = kGpt2Pattern;
  std::vector<std::string> vocab;  ///< raw bytes of id i (ids 0..n-1, all distinct, non-empty)
  /// Merge rules in rank order: (left, right) raw bytes; left+right must be in vocab.
  std::vector<std::pair<std::string, std::string>> merges;
  /// Hugging Face `ignore_merges`: a pre-token that is itself in vocab is emitted as that one id.
  bool ignore_merges = false;
  /// Added/special tokens (content, id): decodable, found by Tokenizer::token_id, not matched in text.
  std::vector<std::pair<std::string, int32_t>> specials;
};

/// Builds the tokenizer. Throws std::runtime_error naming spec.source when the pattern does not
/// compile, a byte has no single-byte token, a merge result is not in vocab, or ids collide.
std::unique_ptr<Tokenizer> make_byte_level_bpe(ByteLevelBpeSpec spec);

/// GPT-2's byte <-> printable-character alphabet: the raw bytes of a symbol string such as "Ġthe".
/// Throws std::runtime_error("<who>: token '<sym>' has a character outside the byte-level alphabet").
std::string byte_level_decode(const std::string& sym, const std::string& who);

/// Escapes `pattern` so PCRE2 matches it literally (\Q...\E is avoided: the text may hold "\E").
std::string regex_quote(const std::string& text);

}  // namespace mfsdp
