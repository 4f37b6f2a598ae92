// The one byte-count formatter of the project (plan reports, trainer logs).
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

namespace mfsdp {

/// Bytes in binary units, whole bytes below 1 KiB and 2 decimals above: "512 B", "1.50 KiB",
/// "12.34 MiB", "3.00 GiB" (up to PiB).
inline std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", u == 0 ? 0 : 2, bytes, units[u]);
  return buf;
}

}  // namespace mfsdp
