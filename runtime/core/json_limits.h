// Limits that every JSON reader applies before parsing untrusted text (configs, --set values,
// safetensors headers, tokenizer tables, checkpoint manifests). Header-only: any layer may use it.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

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

}  // namespace mfsdp
