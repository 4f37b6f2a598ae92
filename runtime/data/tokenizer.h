// Tokenizers for decoding samples and encoding prompts: character-level and GPT-2 byte-level BPE.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mfsdp {

/// Text that cannot be encoded (invalid UTF-8, a character outside a char vocabulary). what() names
/// the byte offset; `reason` is the message without it; byte_offset is the offset of the offending
/// byte in the string passed to encode.
class EncodeError : public std::invalid_argument {
 public:
  EncodeError(const std::string& what, std::string reason, size_t byte_offset)
      : std::invalid_argument(what), reason(std::move(reason)), byte_offset(byte_offset) {}
  std::string reason;
  size_t byte_offset;
};

/// A tokenizer: text (UTF-8 bytes) <-> token ids.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Loads a tokenizer. kind "char": `path` is a char meta JSON ({"itos": [one string per id]},
  /// e.g. data/tiny_shakespeare_char_meta.json). kind "gpt2": `path` is a directory holding
  /// encoder.json and vocab.bpe (or the encoder.json file itself, vocab.bpe beside it).
  /// kind "tokenizer.json": `path` is a Hugging Face tokenizer.json with a byte-level BPE model
  /// (the supported subset is listed in runtime/data/README.md; anything else is refused).
  /// Throws std::invalid_argument for an unknown kind, std::runtime_error naming the file when a
  /// file is missing, malformed or uses an unsupported feature.
  static std::unique_ptr<Tokenizer> load(const std::string& kind, const std::string& path);

  virtual std::string kind() const = 0;
  /// Number of ids (char: itos size; GPT-2: 50257 including <|endoftext|>).
  virtual int64_t vocab_size() const = 0;
  /// Concatenated text of the ids. GPT-2 maps its byte-level alphabet back to raw bytes, so a
  /// sample cut inside a multi-byte character yields invalid UTF-8 bytes (as GPT-2 itself does).
  /// Throws std::out_of_range naming the id and its position when an id is outside [0, vocab_size).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  /// Ids of the text. char: exact, throws EncodeError naming the byte offset of a character
  /// outside the vocabulary. GPT-2: PCRE2 (UTF, UCP) runs the pre-tokenizer pattern
  /// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ then byte-level
  /// BPE with the ranked merges of vocab.bpe (tiktoken's encode_ordinary). tokenizer.json: its
  /// Split regex, then its merges. Special tokens in the text are not recognised. Byte-level
  /// tokenizers throw EncodeError("invalid UTF-8 at byte offset N (...)") for invalid UTF-8.
  /// Thread-safe (each thread keeps its own cache of encoded pre-token words).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  /// Id of one token written in the tokenizer's own terms (char: the character; byte-level: the
  /// raw bytes or an added/special token such as "<|endoftext|>"), or -1 when there is none.
  virtual int32_t token_id(const std::string& token) const = 0;
};

/// Character tokenizer from a list of strings (itos[id]); every string must be non-empty and
/// distinct. Encoding matches the longest entry at each position (entries are usually one character).
std::unique_ptr<Tokenizer> make_char_tokenizer(std::vector<std::string> itos);

/// Hugging Face tokenizer.json (byte-level BPE subset, see Tokenizer::load).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace mfsdp
