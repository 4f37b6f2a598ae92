// The one wall clock of the project: monotonic seconds for step timings and logs.
#pragma once
#include <chrono>

namespace mfsdp {

/// Seconds on the monotonic (steady) clock since an unspecified epoch; only differences matter.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace mfsdp
