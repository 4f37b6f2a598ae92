#include "runtime/data/tokenizer.h"

#include "runtime/core/json_limits.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace mfsdp {

namespace {

std::string read_file(const std::string& path, const char* who) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(std::string("[") + who + "] cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// JSON of a tokenizer file, refused (as a parse error the callers report with the path) when it
// nests deeper than any tokenizer table does.
nlohmann::json parse_bounded_json(const std::string& text) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw nlohmann::json::other_error::create(501, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels",
                                              nullptr);
  return nlohmann::json::parse(text);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes one UTF-8 code point at s[i]; sets len. Invalid bytes decode as themselves (len 1)
// mapped to U+FFFD so they classify as "other" symbols.
uint32_t next_cp(const std::string& s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    len = 1;
    return c < 0x80 ? c : 0xFFFD;
  }
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) {
      len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  len = static_cast<size_t>(n);
  return cp;
}

// ---- Unicode classes for the GPT-2 pre-tokenizer ----
// \s: the Unicode White_Space property (as Python's `regex` module uses).
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// \p{N}: ASCII digits plus the common non-ASCII Nd/Nl/No ranges (an approximation of the full table).
bool is_number(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  static const std::pair<uint32_t, uint32_t> ranges[] = {
      {0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},   {0x6F0, 0x6F9},
      {0x7C0, 0x7C9},   {0x966, 0x96F},   {0x9E6, 0x9EF},   {0xA66, 0xA6F},   {0xAE6, 0xAEF},
      {0xB66, 0xB6F},   {0xBE6, 0xBF2},   {0xC66, 0xC6F},   {0xCE6, 0xCEF},   {0xD66, 0xD78},
      {0xDE6, 0xDEF},   {0xE50, 0xE59},   {0xED0, 0xED9},   {0xF20, 0xF33},   {0x1040, 0x1049},
      {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17E9}, {0x1810, 0x1819},
      {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089},
      {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793},
      {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A}, {0x3192, 0x3195}, {0x3220, 0x3229},
      {0x3248, 0x324F}, {0x3251, 0x325F}, {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0xFF10, 0xFF19},
  };
  for (const auto& [lo, hi] : ranges)
    if (c >= lo && c <= hi) return true;
  return false;
}

// \p{L}: glibc's C.UTF-8 "alpha" class (Unicode letters) minus the numbers above.
bool is_letter(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  if (!loc) throw std::runtime_error("[gpt2 tokenizer] the C.UTF-8 locale is not available");
  return !is_number(c) && iswalpha_l(static_cast<wint_t>(c), loc) != 0;
}

// ---------------------------------------------------------------------------------------------

class CharTokenizer final : public Tokenizer {
 public:
  explicit CharTokenizer(std::vector<std::string> itos) : itos_(std::move(itos)) {
    if (itos_.empty()) throw std::invalid_argument("[char tokenizer] empty itos list");
    if (itos_.size() > static_cast<size_t>(INT32_MAX))
      throw std::invalid_argument("[char tokenizer] itos has too many entries");
    for (size_t i = 0; i < itos_.size(); ++i) {
      if (itos_[i].empty()) throw std::invalid_argument("[char tokenizer] itos[" + std::to_string(i) + "] is empty");
      if (!stoi_.emplace(itos_[i], static_cast<int32_t>(i)).second)
        throw std::invalid_argument("[char tokenizer] itos[" + std::to_string(i) + "] '" + itos_[i] +
                                    "' is a duplicate");
      max_len_ = std::max(max_len_, itos_[i].size());
    }
  }
  std::string kind() const override { return "char"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(itos_.size()); }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= itos_.size())
        throw std::out_of_range("[char tokenizer decode] id " + std::to_string(ids[i]) + " at position " +
                                std::to_string(i) + " is outside [0, " + std::to_string(itos_.size()) + ")");
      out += itos_[ids[i]];
    }
    return out;
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
      bool found = false;
      for (size_t len = std::min(max_len_, text.size() - i); len >= 1; --len) {
        auto it = stoi_.find(text.substr(i, len));
        if (it != stoi_.end()) {
          out.push_back(it->second);
          i += len;
          found = true;
          break;
        }
      }
      if (!found) {
        size_t len = 1;
        next_cp(text, i, len);
        throw std::invalid_argument("[char tokenizer encode] character '" + text.substr(i, len) +
                                    "' at byte offset " + std::to_string(i) + " is not in the vocabulary");
      }
    }
    return out;
  }

 private:
  std::vector<std::string> itos_;
  std::unordered_map<std::string, int32_t> stoi_;
  size_t max_len_ = 1;
};

// ---------------------------------------------------------------------------------------------

class GPT2Tokenizer final : public Tokenizer {
 public:
  GPT2Tokenizer(const std::string& encoder_path, const std::string& bpe_path) {
    // GPT-2's byte <-> unicode alphabet: printable bytes map to themselves, the rest to 256+n.
    std::vector<int> cs(256, -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      if (printable) cs[b] = b;
    }
    for (int b = 0; b < 256; ++b)
      if (cs[b] < 0) cs[b] = 256 + n++;
    for (int b = 0; b < 256; ++b) {
      byte_sym_[b].clear();
      append_utf8(byte_sym_[b], static_cast<uint32_t>(cs[b]));
      sym_byte_[static_cast<uint32_t>(cs[b])] = static_cast<unsigned char>(b);
    }

    nlohmann::json enc;
    try {
      enc = parse_bounded_json(read_file(encoder_path, "gpt2 tokenizer"));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error("[gpt2 tokenizer] " + encoder_path + ": invalid JSON: " + e.what());
    }
    if (!enc.is_object() || enc.empty())
      throw std::runtime_error("[gpt2 tokenizer] " + encoder_path + ": expected an object {token: id}");
    decoder_.assign(enc.size(), std::string());
    for (auto it = enc.begin(); it != enc.end(); ++it) {
      if (!it.value().is_number_integer())
        throw std::runtime_error("[gpt2 tokenizer] " + encoder_path + ": id of '" + it.key() + "' is not an integer");
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= static_cast<int64_t>(enc.size()) || !decoder_[id].empty())
        throw std::runtime_error("[gpt2 tokenizer] " + encoder_path + ": id " + std::to_string(id) + " of '" +
                                 it.key() + "' is out of range or duplicated");
      encoder_.emplace(it.key(), static_cast<int32_t>(id));
      std::string bytes;
      for (size_t i = 0, len = 0; i < it.key().size(); i += len) {
        const uint32_t cp = next_cp(it.key(), i, len);
        auto b = sym_byte_.find(cp);
        if (b == sym_byte_.end())
          throw std::runtime_error("[gpt2 tokenizer] " + encoder_path + ": token '" + it.key() +
                                   "' has a character outside the byte-level alphabet");
        bytes += static_cast<char>(b->second);
      }
      if (bytes.empty()) throw std::runtime_error("[gpt2 tokenizer] " + encoder_path + ": empty token string");
      decoder_[id] = std::move(bytes);
    }

    std::istringstream bpe(read_file(bpe_path, "gpt2 tokenizer"));
    std::string line;
    int rank = 0;
    while (std::getline(bpe, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
        throw std::runtime_error("[gpt2 tokenizer] " + bpe_path + ": malformed merge line " +
                                 std::to_string(rank + 2) + ": '" + line + "'");
      ranks_.emplace(line, rank++);
    }
    if (ranks_.empty()) throw std::runtime_error("[gpt2 tokenizer] " + bpe_path + ": no merges");
  }

  std::string kind() const override { return "gpt2"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= decoder_.size())
        throw std::out_of_range("[gpt2 tokenizer decode] id " + std::to_string(ids[i]) + " at position " +
                                std::to_string(i) + " is outside [0, " + std::to_string(decoder_.size()) + ")");
      out += decoder_[ids[i]];
    }
    return out;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    for (const auto& [begin, end] : pretokenize(text)) bpe(text.substr(begin, end - begin), out);
    return out;
  }

 private:
  // Splits text into [begin, end) byte ranges following GPT-2's pattern (see tokenizer.h).
  static std::vector<std::pair<size_t, size_t>> pretokenize(const std::string& s) {
    std::vector<std::pair<size_t, size_t>> pieces;
    const size_t n = s.size();
    auto cp_at = [&](size_t i, size_t& len) { return next_cp(s, i, len); };
    // Extends j over code points satisfying pred; returns the end.
    auto run = [&](size_t j, auto pred) {
      while (j < n) {
        size_t len;
        if (!pred(cp_at(j, len))) break;
        j += len;
      }
      return j;
    };
    auto is_other = [](uint32_t c) { return !is_space(c) && !is_letter(c) && !is_number(c); };
    size_t i = 0;
    while (i < n) {
      size_t len0;
      const uint32_t c0 = cp_at(i, len0);
      // 1. contractions
      if (c0 == '\'') {
        static const char* suffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
        size_t matched = 0;
        for (const char* suf : suffixes)
          if (s.compare(i + 1, std::strlen(suf), suf) == 0) {
            matched = 1 + std::strlen(suf);
            break;
          }
        if (matched) {
          pieces.emplace_back(i, i + matched);
          i += matched;
          continue;
        }
      }
      // 2-4. optional ' ' then a run of letters / numbers / others
      size_t j = i;
      uint32_t c = c0;
      size_t len = len0;
      if (c0 == ' ' && i + 1 < n) {
        j = i + 1;
        c = cp_at(j, len);
      }
      if (j < n && (j == i || c0 == ' ')) {
        size_t end = j;
        if (is_letter(c)) end = run(j, is_letter);
        else if (is_number(c)) end = run(j, is_number);
        else if (is_other(c)) end = run(j, is_other);
        if (end > j) {
          pieces.emplace_back(i, end);
          i = end;
          continue;
        }
      }
      // 5-6. whitespace: \s+(?!\S) then \s+
      const size_t end = run(i, is_space);
      if (end > i) {
        if (end == n) {
          pieces.emplace_back(i, end);
          i = end;
          continue;
        }
        // Followed by non-space: leave the last whitespace code point for the next piece.
        size_t last = i, k = i;
        while (k < end) {
          size_t l;
          cp_at(k, l);
          last = k;
          k += l;
        }
        const size_t cut = last > i ? last : end;
        pieces.emplace_back(i, cut);
        i = cut;
        continue;
      }
      // Unreachable for valid classification; make progress anyway.
      pieces.emplace_back(i, i + len0);
      i += len0;
    }
    return pieces;
  }

  void bpe(const std::string& piece, std::vector<int32_t>& out) const {
    std::vector<std::string> word;
    for (unsigned char b : piece) word.push_back(byte_sym_[b]);
    while (word.size() > 1) {
      int best = INT_MAX;
      size_t at = 0;
      for (size_t k = 0; k + 1 < word.size(); ++k) {
        auto it = ranks_.find(word[k] + " " + word[k + 1]);
        if (it != ranks_.end() && it->second < best) {
          best = it->second;
          at = k;
        }
      }
      if (best == INT_MAX) break;
      const std::string a = word[at], b = word[at + 1];
      std::vector<std::string> merged;
      for (size_t k = 0; k < word.size();) {
        if (k + 1 < word.size() && word[k] == a && word[k + 1] == b) {
          merged.push_back(a + b);
          k += 2;
        } else {
          merged.push_back(word[k++]);
        }
      }
      word.swap(merged);
    }
    for (const std::string& sym : word) {
      auto it = encoder_.find(sym);
      if (it == encoder_.end()) throw std::runtime_error("[gpt2 tokenizer encode] no id for symbol '" + sym + "'");
      out.push_back(it->second);
    }
  }

  std::string byte_sym_[256];
  std::unordered_map<uint32_t, unsigned char> sym_byte_;
  std::unordered_map<std::string, int32_t> encoder_;
  std::vector<std::string> decoder_;
  std::unordered_map<std::string, int> ranks_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_char_tokenizer(std::vector<std::string> itos) {
  return std::make_unique<CharTokenizer>(std::move(itos));
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& kind, const std::string& path) {
  namespace fs = std::filesystem;
  if (kind == "char") {
    nlohmann::json meta;
    try {
      meta = parse_bounded_json(read_file(path, "char tokenizer"));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error("[char tokenizer] " + path + ": invalid JSON: " + e.what());
    }
    if (!meta.is_object() || !meta.contains("itos") || !meta["itos"].is_array())
      throw std::runtime_error("[char tokenizer] " + path + ": expected an object with an 'itos' list");
    std::vector<std::string> itos;
    for (const auto& e : meta["itos"]) {
      if (!e.is_string()) throw std::runtime_error("[char tokenizer] " + path + ": itos entries must be strings");
      itos.push_back(e.get<std::string>());
    }
    try {
      return make_char_tokenizer(std::move(itos));
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(path + ": " + e.what());
    }
  }
  if (kind == "gpt2") {
    fs::path p(path);
    fs::path dir = fs::is_directory(p) ? p : p.parent_path();
    fs::path enc = fs::is_directory(p) ? dir / "encoder.json" : p;
    return std::make_unique<GPT2Tokenizer>(enc.string(), (dir / "vocab.bpe").string());
  }
  throw std::invalid_argument("[Tokenizer::load] unknown tokenizer kind '" + kind + "' (expected char or gpt2)");
}

}  // namespace mfsdp
