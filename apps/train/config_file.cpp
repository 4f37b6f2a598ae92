// Reading a config file into JSON before the schema checks of train_config.cpp: a bounded regular
// file, nesting limited, no repeated keys, and text that is UTF-8, with errors naming the file,
// the line and, where it can be told, the key.
#include <algorithm>
#include <filesystem>
#include <string>
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

// Parses config text (comments allowed). A key repeated in one object is reported in `duplicate`
// (JSON lets the last one win; in a config that is always a mistake).
json parse_config_text(const std::string& text, std::string& duplicate) {
  std::vector<std::vector<std::string>> keys_seen;  // one list per open object
  auto reject_duplicates = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys_seen.emplace_back();
    else if (event == json::parse_event_t::object_end && !keys_seen.empty()) keys_seen.pop_back();
    else if (event == json::parse_event_t::key && !keys_seen.empty() && duplicate.empty()) {
      const std::string k = parsed.get<std::string>();
      auto& seen = keys_seen.back();
      if (std::find(seen.begin(), seen.end(), k) != seen.end()) duplicate = k;
      seen.push_back(k);
    }
    return true;
  };
  return json::parse(text, reject_duplicates, true, /*ignore_comments=*/true);
}

// The dotted path of the first key or string in `j` that holds U+FFFD, or "".
std::string key_holding_replacement(const json& j, const std::string& prefix) {
  if (j.is_string()) return j.get<std::string>().find(kReplacement) != std::string::npos ? prefix : "";
  if (!j.is_object() && !j.is_array()) return "";
  size_t i = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++i) {
    const std::string here = j.is_object() ? (prefix.empty() ? it.key() : prefix + "." + it.key())
                                            : prefix + "[" + std::to_string(i) + "]";
    if (j.is_object() && it.key().find(kReplacement) != std::string::npos) return here;
    if (std::string k = key_holding_replacement(it.value(), here); !k.empty()) return k;
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
      key = key_holding_replacement(parse_config_text(repaired + rest, duplicate), "");
    } catch (const json::exception&) {
    }
  }
  return (key.empty() ? "" : key + ": ") + where + "; config strings must be UTF-8";
}

}  // namespace

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (fs::is_directory(path)) throw ConfigError(path + ": is a directory, not a config file");
  if (!fs::exists(path)) throw ConfigError(path + ": cannot open the config file");
  // A FIFO or a device: refused by name; a config is small, so more than 64 MiB is refused unread.
  const std::string text = read_input_file<ConfigError>(path, "", size_t{64} << 20);
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw ConfigError(path + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  json doc;
  std::string duplicate;
  try {
    doc = parse_config_text(text, duplicate);
  } catch (const json::exception& e) {
    if (const std::string bad = utf8_parse_problem(text); !bad.empty()) throw ConfigError(path + ": " + bad);
    throw ConfigError(path + ": invalid JSON: " + json_error_text(e.what()));
  }
  if (!duplicate.empty()) throw ConfigError(path + ": key \"" + duplicate + "\" appears twice in the same object");
  const fs::path dir = fs::path(path).parent_path();
  return parse_train_config(doc, path, dir.empty() ? std::string(".") : dir.string(), overrides);
}

}  // namespace mfsdp
