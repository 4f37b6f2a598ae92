// Argument checks shared by every layer: one message format, "[op] message".
#pragma once
#include <stdexcept>
#include <string>

namespace mfsdp {

/// Throws std::invalid_argument "[op] message" when `cond` is false.
inline void check_arg(bool cond, const char* op, const std::string& message) {
  if (!cond) throw std::invalid_argument(std::string("[") + op + "] " + message);
}

}  // namespace mfsdp
