// UTF-8 validity: the one rule for text that becomes JSON (configs, manifests, metadata) or a
// message. JSON writers refuse invalid UTF-8 (nlohmann throws type_error 316 on dump), so inputs
// are checked when they are read, and messages show bad bytes escaped. Header-only: any layer may use it.
#pragma once
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace mfsdp {

/// Offset of the first byte of `s` that does not start a well-formed UTF-8 sequence (a stray
/// continuation byte, a cut sequence, an overlong form, a surrogate, above U+10FFFF), or npos.
inline size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0, n = s.size(); i < n;) {
    const unsigned c = p[i];
    const size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (len == 0 || i + len > n) return i;
    for (size_t k = 1; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] >= 0xA0) || (c == 0xF0 && p[i + 1] < 0x90) ||
        (c == 0xF4 && p[i + 1] >= 0x90))
      return i;  // overlong, surrogate or above U+10FFFF
    i += len;
  }
  return std::string_view::npos;
}

/// True when `s` is well-formed UTF-8.
inline bool is_valid_utf8(std::string_view s) { return invalid_utf8_at(s) == std::string_view::npos; }

/// `s` with every byte that is not part of well-formed UTF-8 written as the four characters
/// "\xNN" (lower-case hex); valid text is unchanged. For messages and JSON fields naming paths.
inline std::string escape_invalid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  while (!s.empty()) {
    const size_t bad = invalid_utf8_at(s);
    if (bad == std::string_view::npos) {
      out += s;
      break;
    }
    out += s.substr(0, bad);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned>(static_cast<unsigned char>(s[bad])));
    out += hex;
    s.remove_prefix(bad + 1);
  }
  return out;
}

/// Why `s` is not UTF-8, for a message: "not valid UTF-8 (byte 0xff at offset 5 of "x/bad\xff")",
/// or "" when it is.
inline std::string utf8_problem(std::string_view s) {
  const size_t bad = invalid_utf8_at(s);
  if (bad == std::string_view::npos) return "";
  char head[64];
  std::snprintf(head, sizeof head, "not valid UTF-8 (byte 0x%02x at offset %zu of \"",
                static_cast<unsigned>(static_cast<unsigned char>(s[bad])), bad);
  const std::string shown = escape_invalid_utf8(s.substr(0, 200));
  return head + shown + (s.size() > 200 ? "...\")" : "\")");
}

}  // namespace mfsdp
