// Limits that every JSON reader applies before parsing untrusted text (configs, --set values,
// safetensors headers, tokenizer tables, checkpoint manifests). Header-only: any layer may use it.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "runtime/core/utf8.h"

namespace mfsdp {

/// Deepest nesting of [ and { outside strings. JSON libraries recurse per level when they build,
/// format or destroy a document, so a document nested 100,000 deep can overflow the stack; callers
/// refuse anything deeper than kMaxJsonDepth before parsing.
inline int json_nesting_depth(std::string_view text) {
  int depth = 0, most = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > most) most = depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return most;
}

/// Nesting any of our JSON inputs legitimately needs is < 10; 64 leaves room and stays far from
/// any stack limit.
constexpr int kMaxJsonDepth = 64;

/// A value for an error message: at most `n` characters, with "..." when cut.
inline std::string clip_for_message(std::string_view s, size_t n = 80) {
  return s.size() > n ? std::string(s.substr(0, n)) + "..." : std::string(s);
}

/// A JSON library error's reason for a message: `what` without nlohmann's
/// "[json.exception.<kind>.<id>] " prefix, bytes that are not UTF-8 shown as \xNN, at most 300
/// characters. E.g. "parse error at line 1, column 5: syntax error while parsing value - ...".
inline std::string json_error_text(std::string_view what) {
  if (what.rfind("[json.exception.", 0) == 0)
    if (const size_t end = what.find("] "); end != std::string_view::npos) what.remove_prefix(end + 2);
  return clip_for_message(escape_invalid_utf8(what), 300);
}

}  // namespace mfsdp
