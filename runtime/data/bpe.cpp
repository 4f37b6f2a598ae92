#include "runtime/data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <atomic>
#include <climits>
#include <stdexcept>
#include <unordered_map>

namespace mfsdp {

namespace {

// Unicode White_Space (stable since Unicode 6.3), the meaning of \s in tiktoken and Hugging Face
// tokenizers. PCRE2's UCP \s differs (it adds U+180E), so patterns use this list instead.
constexpr const char* kWhiteSpaceItems =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s and \S to Unicode White_Space (inside and outside character classes).
std::string widen_space_classes(const std::string& p, const std::string& who) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceItems) : "[" + std::string(kWhiteSpaceItems) + "]";
      } else if (e == 'S') {
        if (in_class) throw std::runtime_error(who + ": \\S inside a character class is not supported in '" + p + "'");
        out += "[^" + std::string(kWhiteSpaceItems) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is a literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t close = p.find(":]", i + 2);
      if (close != std::string::npos) {
        out += p.substr(i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread PCRE2 match buffers: match data (the whole match is all we read, so 16 pairs suffice
// for any pattern; PCRE2 returns 0 when captures do not fit), a match context and a JIT stack.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(16, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() {
    if (!md || !mc) throw std::bad_alloc();
    if (stack) pcre2_jit_stack_assign(mc, nullptr, stack);
  }
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    if (stack) pcre2_jit_stack_free(stack);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

// A compiled PCRE2 pattern (UTF + UCP, JIT when the platform supports it).
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& who) {
    const std::string widened = widen_space_classes(pattern, who);
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(widened.data()), widened.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &at, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error(who + ": the pre-tokenizer pattern '" + pattern + "' does not compile (PCRE2: " +
                               reinterpret_cast<const char*>(msg) + ")");
    }
    (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT support PCRE2 interprets
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls piece(begin, end) for every match and every unmatched gap, in order. Throws
  // EncodeError with the byte offset of the first invalid UTF-8 sequence.
  template <class F>
  void split(const std::string& s, F&& piece) const {
    MatchState& state = match_state();
    pcre2_match_data* md = state.md;
    pcre2_match_context* mc = state.mc;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    const size_t n = s.size();
    size_t pos = 0, emitted = 0;
    uint32_t opts = 0;  // the first call checks the whole subject's UTF-8, later ones skip it
    while (pos < n) {
      const int rc = pcre2_match(code_, subject, n, pos, opts, md, mc);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(rc, msg, sizeof msg);
        const std::string why = reinterpret_cast<const char*>(msg);
        if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
          const size_t off = pcre2_get_startchar(md);
          throw EncodeError("invalid UTF-8 at byte offset " + std::to_string(off) + " (" + why + ")",
                            "invalid UTF-8 (" + why + ")", off);
        }
        throw std::runtime_error("pre-tokenizer match failed at byte offset " + std::to_string(pos) + ": " + why);
      }
      opts = PCRE2_NO_UTF_CHECK;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step over one code point, which stays in the gap
        pos = b + 1;
        while (pos < n && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (b > emitted) piece(emitted, b);
      piece(b, e);
      pos = emitted = e;
    }
    if (emitted < n) piece(emitted, n);
  }

 private:
  pcre2_code* code_ = nullptr;
};

std::atomic<uint64_t> g_instance{0};

constexpr uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

class ByteLevelBpe final : public Tokenizer {
 public:
  explicit ByteLevelBpe(ByteLevelBpeSpec spec)
      : kind_(std::move(spec.kind)),
        regex_(spec.pattern, spec.source),
        ignore_merges_(spec.ignore_merges),
        instance_(++g_instance) {
    const std::string& src = spec.source;
    decoder_ = std::move(spec.vocab);
    for (size_t id = 0; id < decoder_.size(); ++id) {
      if (decoder_[id].empty()) throw std::runtime_error(src + ": id " + std::to_string(id) + " has no token");
      if (!encoder_.emplace(decoder_[id], static_cast<int32_t>(id)).second)
        throw std::runtime_error(src + ": ids " + std::to_string(encoder_[decoder_[id]]) + " and " +
                                 std::to_string(id) + " have the same token");
    }
    for (int b = 0; b < 256; ++b) {
      auto it = encoder_.find(std::string(1, static_cast<char>(b)));
      if (it == encoder_.end())
        throw std::runtime_error(src + ": byte " + std::to_string(b) + " has no single-byte token");
      byte_id_[b] = it->second;
    }
    for (size_t r = 0; r < spec.merges.size(); ++r) {
      const auto& [l, rt] = spec.merges[r];
      auto li = encoder_.find(l), ri = encoder_.find(rt), mi = encoder_.find(l + rt);
      if (li == encoder_.end() || ri == encoder_.end() || mi == encoder_.end())
        throw std::runtime_error(src + ": merge " + std::to_string(r) + " ('" + l + "' '" + rt +
                                 "') has a part or a result outside the vocabulary");
      merges_.emplace(pair_key(li->second, ri->second), std::make_pair(static_cast<int32_t>(r), mi->second));
    }
    // Ids leave no gap, so an added token's id is below vocabulary + added tokens: checked before
    // the table is sized by it (an id of 2^31 - 1 would otherwise allocate 2^31 strings).
    const size_t id_limit = decoder_.size() + spec.specials.size();
    for (auto& [content, id] : spec.specials) {
      if (id < 0) throw std::runtime_error(src + ": added token '" + content + "' has a negative id");
      if (static_cast<size_t>(id) >= id_limit)
        throw std::runtime_error(src + ": added token '" + content + "' has id " + std::to_string(id) + ", beyond the " +
                                 std::to_string(id_limit) + " ids of the vocabulary and the added tokens (ids leave no gap)");
      if (static_cast<size_t>(id) < decoder_.size()) {
        if (decoder_[id] != content)
          throw std::runtime_error(src + ": added token '" + content + "' reuses id " + std::to_string(id) +
                                   " of '" + decoder_[id] + "'");
      } else {
        if (specials_decoder_.size() <= static_cast<size_t>(id) - decoder_.size())
          specials_decoder_.resize(static_cast<size_t>(id) - decoder_.size() + 1);
        specials_decoder_[id - decoder_.size()] = content;
      }
      specials_[content] = id;
    }
    for (size_t k = 0; k < specials_decoder_.size(); ++k)
      if (specials_decoder_[k].empty())
        throw std::runtime_error(src + ": id " + std::to_string(decoder_.size() + k) + " has no token");
  }

  std::string kind() const override { return kind_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size() + specials_decoder_.size()); }

  int32_t token_id(const std::string& token) const override {
    if (auto it = specials_.find(token); it != specials_.end()) return it->second;
    if (auto it = encoder_.find(token); it != encoder_.end()) return it->second;
    return -1;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    const int64_t n = vocab_size();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= n)
        throw std::out_of_range("[" + kind_ + " tokenizer decode] id " + std::to_string(ids[i]) + " at position " +
                                std::to_string(i) + " is outside [0, " + std::to_string(n) + ")");
      const size_t id = static_cast<size_t>(ids[i]);
      out += id < decoder_.size() ? decoder_[id] : specials_decoder_[id - decoder_.size()];
    }
    return out;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3);
    Cache& cache = thread_cache();
    regex_.split(text, [&](size_t b, size_t e) {
      const std::string_view piece(text.data() + b, e - b);
      if (piece.size() == 1) {
        out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
        return;
      }
      auto it = cache.words.find(piece);
      if (it == cache.words.end()) {
        if (cache.words.size() >= kMaxCachedWords) cache.words.clear();
        it = cache.words.emplace(std::string(piece), bpe(piece)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    });
    return out;
  }

 private:
  static constexpr size_t kMaxCachedWords = 1 << 18;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Cache {
    uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> words;
  };

  // This thread's word cache, emptied when it last served another tokenizer instance.
  Cache& thread_cache() const {
    thread_local Cache cache;
    if (cache.owner != instance_) {
      cache.words.clear();
      cache.owner = instance_;
    }
    return cache;
  }

  // Merges the bytes of one pre-token: repeatedly the lowest-ranked adjacent pair, leftmost first.
  std::vector<int32_t> bpe(std::string_view piece) const {
    if (ignore_merges_) {
      auto it = encoder_.find(std::string(piece));
      if (it != encoder_.end()) return {it->second};
    }
    std::vector<int32_t> w(piece.size());
    for (size_t k = 0; k < piece.size(); ++k) w[k] = byte_id_[static_cast<unsigned char>(piece[k])];
    while (w.size() > 1) {
      int32_t best = INT32_MAX, merged = -1;
      size_t at = 0;
      for (size_t k = 0; k + 1 < w.size(); ++k) {
        auto it = merges_.find(pair_key(w[k], w[k + 1]));
        if (it != merges_.end() && it->second.first < best) {
          best = it->second.first;
          merged = it->second.second;
          at = k;
        }
      }
      if (merged < 0) break;
      w[at] = merged;
      w.erase(w.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    return w;
  }

  std::string kind_;
  Regex regex_;
  bool ignore_merges_;
  uint64_t instance_;
  std::vector<std::string> decoder_;
  std::vector<std::string> specials_decoder_;  // ids decoder_.size() and up
  std::unordered_map<std::string, int32_t> encoder_;
  std::unordered_map<std::string, int32_t> specials_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> (rank, merged id)
  int32_t byte_id_[256] = {};
};

// The byte-level alphabet: printable bytes stand for themselves, the other 68 for U+0100 and up.
struct ByteAlphabet {
  std::unordered_map<uint32_t, unsigned char> to_byte;
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_byte[printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++)] = static_cast<unsigned char>(b);
    }
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_level_bpe(ByteLevelBpeSpec spec) {
  return std::make_unique<ByteLevelBpe>(std::move(spec));
}

std::string byte_level_decode(const std::string& sym, const std::string& who) {
  static const ByteAlphabet alphabet;
  std::string bytes;
  for (size_t i = 0; i < sym.size();) {
    const auto c = static_cast<unsigned char>(sym[i]);
    uint32_t cp = c;
    size_t len = 1;
    if (c >= 0xC0 && c < 0xE0 && i + 1 < sym.size()) {  // the alphabet is below U+0800
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(sym[i + 1]) & 0x3Fu);
      len = 2;
    } else if (c >= 0x80) {
      cp = UINT32_MAX;
    }
    auto it = alphabet.to_byte.find(cp);
    if (it == alphabet.to_byte.end())
      throw std::runtime_error(who + ": token '" + sym + "' has a character outside the byte-level alphabet");
    bytes += static_cast<char>(it->second);
    i += len;
  }
  return bytes;
}

std::string regex_quote(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace mfsdp
