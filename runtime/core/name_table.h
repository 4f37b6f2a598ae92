// Names of enumerations as configs and command lines write them: one table per enum, used for
// parsing, printing, listing the choices and did-you-mean. Also the tri-state Toggle.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mfsdp {

/// The names of enumeration E, one per value, in the order they are listed to users.
template <class E, size_t N>
struct NameTable {
  std::array<std::pair<E, const char*>, N> entries;

  /// The name of `e` (every value of E has one; "?" for a value outside the table).
  constexpr const char* name(E e) const {
    for (const auto& [v, n] : entries)
      if (v == e) return n;
    return "?";
  }
  /// The value named `s`, or nullopt.
  std::optional<E> find(std::string_view s) const {
    for (const auto& [v, n] : entries)
      if (s == n) return v;
    return std::nullopt;
  }
  /// The value named `s`; throws std::invalid_argument "unknown <what> 's' (expected a, b or c)".
  E parse(const std::string& s, const char* what) const {
    if (auto v = find(s)) return *v;
    throw std::invalid_argument(std::string("unknown ") + what + " '" + s + "' (expected " + list(" or ") + ")");
  }
  /// Every name, in table order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries) out.emplace_back(e.second);
    return out;
  }
  /// The names joined by ", " with `last` before the final one ("a, b or c").
  std::string list(const char* last = ", ") const {
    std::string s;
    for (size_t i = 0; i < N; ++i) s += (i == 0 ? "" : i + 1 == N ? last : ", ") + std::string(entries[i].second);
    return s;
  }
};

/// A switch whose default depends on where it runs: `automatic` leaves the choice to the
/// device's default (see the option that holds it), `on` and `off` force it.
enum class Toggle { automatic, on, off };

/// "auto", "on", "off".
inline constexpr NameTable<Toggle, 3> kToggleNames{{{{Toggle::automatic, "auto"}, {Toggle::on, "on"}, {Toggle::off, "off"}}}};

/// `t` with `automatic` replaced by `device_default`.
constexpr bool toggle_value(Toggle t, bool device_default) {
  return t == Toggle::automatic ? device_default : t == Toggle::on;
}

}  // namespace mfsdp
