#include "runtime/block_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/cuda/device_api.h"

namespace mfsdp {

BlockCache::BlockCache(RawAlloc raw_alloc, RawFree raw_free, size_t min_block, size_t max_cached,
                       bool bounded_by_peak, RawResize resize)
    : raw_alloc_(raw_alloc),
      raw_free_(raw_free),
      resize_(resize),
      min_block_(min_block),
      max_cached_(max_cached),
      bounded_by_peak_(bounded_by_peak) {}

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

BlockCache::Room BlockCache::make_room(size_t bytes) {
  Room room;
  const int64_t in_use = stats_.in_use_bytes + static_cast<int64_t>(bytes);
  const int64_t free_bytes = std::max(stats_.peak_in_use_bytes, in_use) - in_use;
  if (!bounded_by_peak_ || stats_.cached_bytes <= free_bytes) return room;
  auto take = [&](std::multimap<size_t, void*>::iterator it) {
    stats_.cached_bytes -= static_cast<int64_t>(it->first);
    std::pair<size_t, void*> block = *it;
    free_.erase(it);
    return block;
  };
  if (resize_) {  // the nearest size: the smallest block at least as large, else the largest
    auto it = free_.lower_bound(bytes);
    room.resized = take(it != free_.end() ? it : std::prev(free_.end()));
  }
  while (stats_.cached_bytes > free_bytes) {
    room.freed.push_back(take(std::prev(free_.end())));
    ++stats_.evictions;
    ++stats_.raw_frees;
  }
  return room;
}

void* BlockCache::get(size_t bytes) {
  if (bytes == 0) throw std::invalid_argument("[BlockCache] zero-byte block");
  if (bytes < min_block_) {
    void* p = raw(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.uncached_allocs;
    return p;
  }
  Room room;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(bytes);
      ++stats_.reuses;
      note_in_use(static_cast<int64_t>(bytes));
      return p;
    }
    room = make_room(bytes);
  }
  for (const auto& [size, block] : room.freed) raw_free_(block, size);
  void* p = nullptr;
  if (room.resized.second) {
    p = resize_(room.resized.second, room.resized.first, bytes);
    if (!p) raw_free_(room.resized.second, room.resized.first);
  }
  const bool resized = p != nullptr;
  if (!p) p = raw(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++(resized ? stats_.resizes : stats_.raw_allocs);
  if (room.resized.second && !resized) ++stats_.raw_frees;
  note_in_use(static_cast<int64_t>(bytes));
  return p;
}

void BlockCache::note_in_use(int64_t delta) {
  stats_.in_use_bytes += delta;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
}

void BlockCache::put(void* p, size_t bytes) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes >= min_block_) {
      note_in_use(-static_cast<int64_t>(bytes));
      if (static_cast<size_t>(stats_.cached_bytes) + bytes <= max_cached_) {
        free_.emplace(bytes, p);
        stats_.cached_bytes += static_cast<int64_t>(bytes);
        return;
      }
      ++stats_.raw_frees;
    }
  }
  raw_free_(p, bytes);
}

void BlockCache::clear() {
  std::vector<std::pair<size_t, void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.assign(free_.begin(), free_.end());
    stats_.raw_frees += static_cast<int64_t>(blocks.size());
    stats_.cached_bytes = 0;
    free_.clear();
  }
  for (const auto& [bytes, p] : blocks) raw_free_(p, bytes);
}

BlockCacheStats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

namespace {
constexpr size_t kHostMinCachedBlock = size_t(1) << 20;  // also where host blocks start being mapped

// Cacheable host blocks are mapped, not taken from the heap: the heap keeps freed mid-sized chunks
// resident (glibc raises its mmap threshold to 32 MiB as blocks are freed), a mapping leaves at once.
void* host_alloc(size_t bytes) {
  if (bytes < kHostMinCachedBlock) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
void host_free(void* p, size_t bytes) {
  if (bytes < kHostMinCachedBlock) std::free(p);
  else munmap(p, bytes);
}
// A cached mapping made the new size in place or moved (mremap): the pages it keeps stay resident,
// so reusing a block of a near size costs page faults only for what it grows by.
void* host_resize(void* p, size_t old_bytes, size_t new_bytes) {
  void* q = mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE);
  return q == MAP_FAILED ? nullptr : q;
}
void* device_alloc(size_t bytes) { return cuda::malloc_device(static_cast<int64_t>(bytes)); }
void device_free(void* p, size_t) { cuda::free_device(p); }
}  // namespace

BlockCache& block_cache(Device device) {
  static BlockCache* host = new BlockCache(host_alloc, host_free, kHostMinCachedBlock, size_t(4) << 30, true, host_resize);
  static BlockCache* gpu = new BlockCache(device_alloc, device_free, 1, SIZE_MAX, false);
  return device == Device::CPU ? *host : *gpu;
}

}  // namespace mfsdp
