// Tracking allocator: every Storage allocation is counted per device and per category.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>

#include "runtime/core/dtype.h"

namespace mfsdp {

/// What an allocation is for; benchmarks and the trainer report peaks per category.
enum class MemCategory : int {
  parameters = 0,      // owned parameter shards (persistent)
  gathered_params,     // transient full-unit parameters after an all-gather
  gradients,           // gradient shards and transient full-unit gradients
  optimizer_state,     // Muon momentum, AdamW m and v
  activations,         // forward activations saved for backward and their gradients
  comm_buffers,        // staging buffers of collectives
  other,
  gathered_grads,      // transient full-unit gradients during a unit's backward, before the reduce
  count
};
const char* mem_category_name(MemCategory c);

/// Process-wide byte counters. Thread-safe. Units: bytes.
class MemoryTracker {
 public:
  static MemoryTracker& instance();
  void on_alloc(Device d, MemCategory c, int64_t bytes);
  void on_free(Device d, MemCategory c, int64_t bytes);
  int64_t current(Device d, MemCategory c) const;
  int64_t peak(Device d, MemCategory c) const;
  /// Peak of the sum over categories (not the sum of per-category peaks).
  int64_t peak_total(Device d) const;
  int64_t current_total(Device d) const;
  /// Sets every peak to the current value (start of a measured region).
  void reset_peaks();

 private:
  static constexpr int kDev = 2, kCat = static_cast<int>(MemCategory::count);
  mutable std::mutex mu_;
  std::array<std::array<int64_t, kCat>, kDev> current_{}, peak_{};
  std::array<int64_t, kDev> total_{}, total_peak_{};
};

/// The category new allocations are charged to on this thread (default: activations).
MemCategory current_mem_category();

/// RAII: charges allocations made on this thread to `c` until the scope ends.
class MemCategoryScope {
 public:
  explicit MemCategoryScope(MemCategory c);
  ~MemCategoryScope();
  MemCategoryScope(const MemCategoryScope&) = delete;
  MemCategoryScope& operator=(const MemCategoryScope&) = delete;

 private:
  MemCategory prev_;
};

}  // namespace mfsdp
