#include "runtime/block_cache.h"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/cuda/device_api.h"

namespace mfsdp {

BlockCache::BlockCache(RawAlloc raw_alloc, RawFree raw_free, size_t min_block, size_t max_cached)
    : raw_alloc_(raw_alloc), raw_free_(raw_free), min_block_(min_block), max_cached_(max_cached) {}

void* BlockCache::raw(size_t bytes) {
  try {
    if (void* p = raw_alloc_(bytes)) return p;
  } catch (const std::exception&) {
  }
  clear();  // give cached blocks back and try once more
  void* p = nullptr;
  std::string why;
  try {
    p = raw_alloc_(bytes);
  } catch (const std::exception& e) {
    why = std::string(": ") + e.what();
  }
  if (!p) throw std::runtime_error("[BlockCache] out of memory allocating " + std::to_string(bytes) + " bytes" + why);
  return p;
}

void* BlockCache::get(size_t bytes) {
  if (bytes == 0) throw std::invalid_argument("[BlockCache] zero-byte block");
  if (bytes >= min_block_) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(bytes);
      ++stats_.reuses;
      return p;
    }
  }
  void* p = raw(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++(bytes >= min_block_ ? stats_.raw_allocs : stats_.uncached_allocs);
  return p;
}

void BlockCache::put(void* p, size_t bytes) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes >= min_block_) {
      if (static_cast<size_t>(stats_.cached_bytes) + bytes <= max_cached_) {
        free_.emplace(bytes, p);
        stats_.cached_bytes += static_cast<int64_t>(bytes);
        return;
      }
      ++stats_.raw_frees;
    }
  }
  raw_free_(p);
}

void BlockCache::clear() {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [bytes, p] : free_) blocks.push_back(p);
    stats_.raw_frees += static_cast<int64_t>(blocks.size());
    stats_.cached_bytes = 0;
    free_.clear();
  }
  for (void* p : blocks) raw_free_(p);
}

BlockCacheStats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

namespace {
void* host_alloc(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
void* device_alloc(size_t bytes) { return cuda::malloc_device(static_cast<int64_t>(bytes)); }
}  // namespace

BlockCache& block_cache(Device device) {
  static BlockCache* host = new BlockCache(host_alloc, std::free, size_t(1) << 20, size_t(4) << 30);
  static BlockCache* gpu = new BlockCache(device_alloc, cuda::free_device, 1, SIZE_MAX);
  return device == Device::CPU ? *host : *gpu;
}

}  // namespace mfsdp
