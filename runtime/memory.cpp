#include "runtime/memory.h"

#include <algorithm>

namespace mfsdp {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::parameters: return "parameters";
    case MemCategory::gathered_params: return "gathered_params";
    case MemCategory::gradients: return "gradients";
    case MemCategory::optimizer_state: return "optimizer_state";
    case MemCategory::activations: return "activations";
    case MemCategory::comm_buffers: return "comm_buffers";
    case MemCategory::other: return "other";
    case MemCategory::gathered_grads: return "gathered_grads";
    default: return "?";
  }
}

MemoryTracker& MemoryTracker::instance() {
  static MemoryTracker t;
  return t;
}

void MemoryTracker::on_alloc(Device d, MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int di = static_cast<int>(d), ci = static_cast<int>(c);
  current_[di][ci] += bytes;
  peak_[di][ci] = std::max(peak_[di][ci], current_[di][ci]);
  total_[di] += bytes;
  total_peak_[di] = std::max(total_peak_[di], total_[di]);
}

void MemoryTracker::on_free(Device d, MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  current_[static_cast<int>(d)][static_cast<int>(c)] -= bytes;
  total_[static_cast<int>(d)] -= bytes;
}

int64_t MemoryTracker::current(Device d, MemCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_[static_cast<int>(d)][static_cast<int>(c)];
}
int64_t MemoryTracker::peak(Device d, MemCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_[static_cast<int>(d)][static_cast<int>(c)];
}
int64_t MemoryTracker::peak_total(Device d) const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_peak_[static_cast<int>(d)];
}
int64_t MemoryTracker::current_total(Device d) const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_[static_cast<int>(d)];
}
void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = current_;
  total_peak_ = total_;
}

namespace {
thread_local MemCategory t_category = MemCategory::activations;
}
MemCategory current_mem_category() { return t_category; }
MemCategoryScope::MemCategoryScope(MemCategory c) : prev_(t_category) { t_category = c; }
MemCategoryScope::~MemCategoryScope() { t_category = prev_; }

}  // namespace mfsdp
