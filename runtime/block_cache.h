// Caching allocators in front of the raw device allocators: a training step allocates and frees
// the same activation, gradient and gathered-unit sizes every iteration, so freed blocks are kept
// by exact size and handed out again. On the host this saves the page faults of first touch; on
// a GPU it keeps cudaMalloc (a device synchronisation) out of the steady state, and the statistics
// prove it: after the first steps `raw_allocs` stops growing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "runtime/core/dtype.h"

namespace mfsdp {

/// Counters of one cache since process start (never reset; take differences).
struct BlockCacheStats {
  int64_t raw_allocs = 0;       ///< raw allocations (cudaMalloc / aligned_alloc) of cacheable blocks
  int64_t reuses = 0;           ///< requests served from the cache
  int64_t raw_frees = 0;        ///< cacheable blocks given back to the raw allocator
  int64_t uncached_allocs = 0;  ///< raw allocations of blocks below the cache's minimum size
  int64_t cached_bytes = 0;  ///< bytes held in the cache now (free, not in use)
};

/// Freed blocks keyed by exact byte size, up to `max_cached` bytes in all; blocks smaller than
/// `min_block` bypass the cache. Thread-safe. Not copyable.
class BlockCache {
 public:
  using RawAlloc = void* (*)(size_t bytes);  ///< returns nullptr or throws on failure
  using RawFree = void (*)(void* p);
  BlockCache(RawAlloc raw_alloc, RawFree raw_free, size_t min_block, size_t max_cached);
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  /// A block of exactly `bytes` (> 0): a cached one of that size, else a fresh one. When the raw
  /// allocator fails (nullptr or an exception), the cache is emptied and the allocation retried
  /// once; a second failure throws std::runtime_error naming the size and the cached bytes.
  void* get(size_t bytes);
  /// Takes back a block obtained from get(bytes).
  void put(void* p, size_t bytes);
  /// Gives every cached block back to the raw allocator.
  void clear();
  BlockCacheStats stats() const;

 private:
  void* raw(size_t bytes);

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  size_t min_block_, max_cached_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  BlockCacheStats stats_;
};

/// The process-wide cache of `device`'s Storage allocations: host blocks of >= 1 MiB up to
/// 4 GiB cached (64-byte aligned), every CUDA block cached without limit (emptied and retried
/// when the device runs out of memory). Never destroyed: it outlives static tensors.
BlockCache& block_cache(Device device);

}  // namespace mfsdp
