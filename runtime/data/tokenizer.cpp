#include "runtime/data/tokenizer.h"

#include "runtime/data/bpe.h"

#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"

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
  return read_input_file(path, std::string("[") + who + "]");
}

// JSON of a tokenizer file, refused (as a parse error the callers report with the path) when it
// nests deeper than any tokenizer table does.
nlohmann::json parse_bounded_json(const std::string& text) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw nlohmann::json::other_error::create(501, "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels",
                                              nullptr);
  return nlohmann::json::parse(text);
}

// The JSON of a tokenizer file; errors read "[<who>] <path>: invalid JSON: ...".
nlohmann::json read_json_file(const std::string& path, const std::string& who) {
  const std::string text = read_file(path, who.c_str());
  try {
    return parse_bounded_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("[" + who + "] " + path + ": invalid JSON: " + e.what());
  }
}

// Length of the UTF-8 sequence led by byte c (1 for a stray continuation or invalid lead byte).
size_t utf8_len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 1; }

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
  int32_t token_id(const std::string& token) const override {
    auto it = stoi_.find(token);
    return it == stoi_.end() ? -1 : it->second;
  }
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
      if (!found)
        throw EncodeError("[char tokenizer encode] character '" + text.substr(i, utf8_len(text[i])) +
                              "' at byte offset " + std::to_string(i) + " is not in the vocabulary",
                          "character '" + text.substr(i, utf8_len(text[i])) + "' is not in the vocabulary", i);
    }
    return out;
  }

 private:
  std::vector<std::string> itos_;
  std::unordered_map<std::string, int32_t> stoi_;
  size_t max_len_ = 1;
};

// ---------------------------------------------------------------------------------------------

// GPT-2 from encoder.json ({symbol string: id}) and vocab.bpe (ranked "left right" merge lines).
std::unique_ptr<Tokenizer> load_gpt2(const std::string& encoder_path, const std::string& bpe_path) {
  ByteLevelBpeSpec spec;
  spec.kind = "gpt2";
  spec.source = "[gpt2 tokenizer] " + encoder_path;
  const nlohmann::json enc = read_json_file(encoder_path, "gpt2 tokenizer");
  if (!enc.is_object() || enc.empty()) throw std::runtime_error(spec.source + ": expected an object {token: id}");
  spec.vocab.assign(enc.size(), std::string());
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    if (!it.value().is_number_integer())
      throw std::runtime_error(spec.source + ": id of '" + it.key() + "' is not an integer");
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(enc.size()) || !spec.vocab[id].empty())
      throw std::runtime_error(spec.source + ": id " + std::to_string(id) + " of '" + it.key() +
                               "' is out of range or duplicated");
    spec.vocab[id] = byte_level_decode(it.key(), spec.source);
    if (spec.vocab[id].empty()) throw std::runtime_error(spec.source + ": empty token string");
  }
  std::istringstream bpe(read_file(bpe_path, "gpt2 tokenizer"));
  std::string line;
  int line_no = 0;
  while (std::getline(bpe, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
      throw std::runtime_error("[gpt2 tokenizer] " + bpe_path + ": malformed merge line " + std::to_string(line_no) +
                               ": '" + line + "'");
    spec.merges.emplace_back(byte_level_decode(line.substr(0, sp), bpe_path),
                             byte_level_decode(line.substr(sp + 1), bpe_path));
  }
  if (spec.merges.empty()) throw std::runtime_error("[gpt2 tokenizer] " + bpe_path + ": no merges");
  return make_byte_level_bpe(std::move(spec));
}

}  // namespace

std::unique_ptr<Tokenizer> make_char_tokenizer(std::vector<std::string> itos) {
  return std::make_unique<CharTokenizer>(std::move(itos));
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& kind, const std::string& path) {
  namespace fs = std::filesystem;
  if (kind == "char") {
    const nlohmann::json meta = read_json_file(path, "char tokenizer");
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
    return load_gpt2(enc.string(), (dir / "vocab.bpe").string());
  }
  if (kind == "tokenizer.json") return load_hf_tokenizer(path);
  throw std::invalid_argument("[Tokenizer::load] unknown tokenizer kind '" + kind +
                              "' (expected char, gpt2 or tokenizer.json)");
}

// ---- Hugging Face tokenizer.json: the byte-level BPE subset (runtime/data/README.md) ----

namespace {

[[noreturn]] void hf_refuse(const std::string& path, const std::string& what) {
  throw std::runtime_error("[tokenizer.json] " + path + ": " + what +
                           " is not supported (supported: byte-level BPE; see runtime/data/README.md)");
}

bool null_or(const nlohmann::json& obj, const char* key, const nlohmann::json& allowed) {
  return !obj.contains(key) || obj[key].is_null() || obj[key] == allowed;
}

// The pre-tokenizer regex: ByteLevel(use_regex) alone, or Sequence[Split(Isolated), ByteLevel(no regex)].
std::string hf_pattern(const nlohmann::json& pre, const std::string& path) {
  auto byte_level = [&](const nlohmann::json& p, bool want_regex) {
    if (!p.is_object() || p.value("type", "") != "ByteLevel") return false;
    if (p.value("add_prefix_space", false)) hf_refuse(path, "pre_tokenizer ByteLevel add_prefix_space=true");
    if (p.value("use_regex", true) != want_regex)
      hf_refuse(path, std::string("pre_tokenizer ByteLevel use_regex=") + (want_regex ? "false" : "true") +
                          (want_regex ? " without a Split before it" : " after a Split"));
    return true;
  };
  if (byte_level(pre, true)) return kGpt2Pattern;
  if (!pre.is_object() || pre.value("type", "") != "Sequence" || !pre.contains("pretokenizers") ||
      !pre["pretokenizers"].is_array() || pre["pretokenizers"].size() != 2)
    hf_refuse(path, "pre_tokenizer " + pre.dump().substr(0, 200));
  const auto& split = pre["pretokenizers"][0];
  if (!split.is_object() || split.value("type", "") != "Split")
    hf_refuse(path, "pre_tokenizer Sequence not starting with Split");
  if (split.value("behavior", "") != "Isolated") hf_refuse(path, "Split behavior '" + split.value("behavior", "") + "'");
  if (split.value("invert", false)) hf_refuse(path, "Split invert=true");
  if (!byte_level(pre["pretokenizers"][1], false))
    hf_refuse(path, "pre_tokenizer Sequence whose second step is not ByteLevel");
  const auto& pat = split.value("pattern", nlohmann::json::object());
  if (pat.contains("Regex") && pat["Regex"].is_string()) return pat["Regex"].get<std::string>();
  if (pat.contains("String") && pat["String"].is_string()) return regex_quote(pat["String"].get<std::string>());
  hf_refuse(path, "Split pattern " + pat.dump());
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "tokenizer.json");
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw std::runtime_error("[tokenizer.json] " + path + ": expected an object with a 'model' object");
  const auto& m = j["model"];
  if (m.value("type", "BPE") != "BPE") hf_refuse(path, "model type '" + m.value("type", "") + "'");
  if (!null_or(j, "normalizer", nullptr)) hf_refuse(path, "a normalizer");
  if (!null_or(m, "dropout", nullptr)) hf_refuse(path, "BPE dropout");
  if (!null_or(m, "continuing_subword_prefix", "")) hf_refuse(path, "continuing_subword_prefix");
  if (!null_or(m, "end_of_word_suffix", "")) hf_refuse(path, "end_of_word_suffix");
  if (!null_or(m, "byte_fallback", false)) hf_refuse(path, "byte_fallback");
  if (j.contains("decoder") && !j["decoder"].is_null() && j["decoder"].value("type", "") != "ByteLevel")
    hf_refuse(path, "decoder '" + j["decoder"].value("type", "?") + "'");
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) hf_refuse(path, "a missing pre_tokenizer");

  ByteLevelBpeSpec spec;
  spec.kind = "tokenizer.json";
  spec.source = "[tokenizer.json] " + path;
  spec.pattern = hf_pattern(j["pre_tokenizer"], path);
  spec.ignore_merges = m.value("ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object() || m["vocab"].empty())
    throw std::runtime_error(spec.source + ": model.vocab must be a non-empty object {token: id}");
  spec.vocab.assign(m["vocab"].size(), std::string());
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    const int64_t id = it.value().is_number_integer() ? it.value().get<int64_t>() : -1;
    if (id < 0 || id >= static_cast<int64_t>(spec.vocab.size()) || !spec.vocab[id].empty())
      throw std::runtime_error(spec.source + ": model.vocab id of '" + it.key() +
                               "' is not an integer in [0, number of entries) or is duplicated");
    spec.vocab[id] = byte_level_decode(it.key(), spec.source);
  }
  if (!m.contains("merges") || !m["merges"].is_array())
    throw std::runtime_error(spec.source + ": model.merges must be a list");
  for (const auto& mg : m["merges"]) {
    std::string l, r;
    if (mg.is_string()) {  // "left right"
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
        throw std::runtime_error(spec.source + ": malformed merge '" + s + "'");
      l = s.substr(0, sp);
      r = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {  // ["left", "right"]
      l = mg[0].get<std::string>();
      r = mg[1].get<std::string>();
    } else {
      throw std::runtime_error(spec.source + ": malformed merge " + mg.dump());
    }
    spec.merges.emplace_back(byte_level_decode(l, spec.source), byte_level_decode(r, spec.source));
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        throw std::runtime_error(spec.source + ": added_tokens entries need an integer 'id' and a string 'content'");
      const int64_t id = t["id"].get<int64_t>();
      if (id < 0 || id > INT32_MAX) throw std::runtime_error(spec.source + ": added token id out of range");
      spec.specials.emplace_back(t["content"].get<std::string>(), static_cast<int32_t>(id));
    }
  return make_byte_level_bpe(std::move(spec));
}

}  // namespace mfsdp
