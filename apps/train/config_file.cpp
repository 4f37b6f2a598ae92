// Reading a config file into JSON before the schema checks of train_config.cpp: a bounded regular
// file, nesting limited, no repeated keys, and text that is UTF-8, with errors naming the file,
// the line and, where it can be told, the key.
#include <algorithm>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "apps/train/train_config.h"
#include "runtime/core/file_checks.h"
#include "runtime/core/json_limits.h"

namespace mfsdp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// U+FFFD, put in place of each byte that is not UTF-8 to find the key that holds it.
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Thrown from the parser's callback at the first container nested deeper than kMaxJsonDepth: the
// parser itself counts the depth, so comments and strings cannot hide a level from the guard.
struct NestedTooDeep {};

// Parses config text (comments allowed). A key repeated in one object is reported in `duplicate`
// (JSON lets the last one win; in a config that is always a mistake). Throws NestedTooDeep, or
// json::exception for text that is not JSON.
json parse_config_text(const std::string& text, std::string& duplicate) {
  std::vector<std::unordered_set<std::string>> keys_seen;  // one set per open object
  auto check_event = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) throw NestedTooDeep{};  // `depth` containers are open around it
        if (event == json::parse_event_t::object_start) keys_seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys_seen.empty()) keys_seen.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_seen.empty() && !keys_seen.back().insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default:
        break;
    }
    return true;
  };
  return json::parse(text, check_event, true, /*ignore_comments=*/true);
}

// The dotted path of the first key or string in `j` that holds `needle`, or "".
std::string key_holding(const json& j, std::string_view needle, const std::string& prefix) {
  if (j.is_string()) return j.get_ref<const std::string&>().find(needle) != std::string::npos ? prefix : "";
  if (!j.is_object() && !j.is_array()) return "";
  size_t i = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++i) {
    const std::string here = j.is_object() ? (prefix.empty() ? it.key() : prefix + "." + it.key())
                                            : prefix + "[" + std::to_string(i) + "]";
    if (j.is_object() && it.key().find(needle) != std::string::npos) return here;
    if (std::string k = key_holding(it.value(), needle, here); !k.empty()) return k;
  }
  return "";
}

// Why text that failed to parse is refused, when the cause is a byte that is not UTF-8:
// "<key>: not valid UTF-8 (line L, column C: byte 0xNN); config strings must be UTF-8" (the key
// when the text parses with the bad bytes replaced); "" when the text is UTF-8.
std::string utf8_parse_problem(const std::string& text) {
  const size_t bad = invalid_utf8_at(text);
  if (bad == std::string::npos) return "";
  const size_t line = static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n')) + 1;
  const size_t line_start = text.rfind('\n', bad == 0 ? 0 : bad - 1);
  const size_t column = bad - (line_start == std::string::npos || bad == 0 ? 0 : line_start + 1) + 1;
  char where[96];
  std::snprintf(where, sizeof where, "not valid UTF-8 (line %zu, column %zu: byte 0x%02x)", line, column,
                static_cast<unsigned>(static_cast<unsigned char>(text[bad])));
  std::string key;
  if (text.find(kReplacement) == std::string::npos) {  // otherwise a found U+FFFD may be the file's own
    std::string repaired, rest = text;
    for (size_t at; (at = invalid_utf8_at(rest)) != std::string::npos; rest.erase(0, at + 1))
      repaired += rest.substr(0, at) + std::string(kReplacement);
    std::string duplicate;
    try {
      key = key_holding(parse_config_text(repaired + rest, duplicate), kReplacement, "");
    } catch (const json::exception&) {
    } catch (const NestedTooDeep&) {
    }
  }
  return (key.empty() ? "" : key + ": ") + where + "; config strings must be UTF-8";
}

}  // namespace

json parse_config_json(const std::string& text, const std::string& where, bool plain_string_if_not_json) {
  json doc;
  std::string duplicate;
  try {
    doc = parse_config_text(text, duplicate);
  } catch (const NestedTooDeep&) {
    throw ConfigError(where + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const json::exception& e) {
    if (plain_string_if_not_json) return json(text);  // its UTF-8 is checked with every config string
    if (const std::string bad = utf8_parse_problem(text); !bad.empty()) throw ConfigError(where + ": " + bad);
    throw ConfigError(where + ": invalid JSON: " + json_error_text(e.what()));
  }
  if (!duplicate.empty()) throw ConfigError(where + ": key \"" + duplicate + "\" appears twice in the same object");
  constexpr std::string_view kNul("\0", 1);  // cuts C strings: paths, messages
  const std::string key = doc.is_string() ? (doc.get_ref<const std::string&>().find(kNul) != std::string::npos ? "value" : "")
                                          : key_holding(doc, kNul, "");
  if (!key.empty()) throw ConfigError(where + ": " + key + ": holds a NUL character (\\u0000); config keys and strings cannot");
  return doc;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (fs::is_directory(path)) throw ConfigError(path + ": is a directory, not a config file");
  if (!fs::exists(path)) throw ConfigError(path + ": cannot open the config file");
  // A FIFO or a device: refused by name; a config is small, so more than 64 MiB is refused unread.
  const std::string text = read_input_file<ConfigError>(path, "", size_t{64} << 20);
  const json doc = parse_config_json(text, path, false);
  const fs::path dir = fs::path(path).parent_path();
  return parse_train_config(doc, path, dir.empty() ? std::string(".") : dir.string(), overrides);
}

}  // namespace mfsdp
