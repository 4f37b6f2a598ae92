// The host's memory as /proc/meminfo reports it, header-only so tools and the trainer read it alike.
#pragma once
#include <fstream>
#include <optional>
#include <string>

namespace mfsdp {

/// Bytes of /proc/meminfo's field `key` (e.g. "MemTotal", "MemAvailable"); none when the file or
/// the field is missing.
inline std::optional<double> meminfo_bytes(const std::string& key) {
  std::ifstream f("/proc/meminfo");
  std::string name, unit;
  double kb = 0;
  while (f >> name >> kb) {
    if (name == key + ":") return kb * 1024.0;
    std::getline(f, unit);  // the rest of the line ("kB", or nothing)
  }
  return std::nullopt;
}

}  // namespace mfsdp
