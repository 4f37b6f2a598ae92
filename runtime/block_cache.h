// Caching allocators in front of the raw device allocators: a training step allocates and frees
// the same activation, gradient and gathered-unit sizes every iteration, so freed blocks are kept
// by exact size and handed out again. On the host this saves the page faults of first touch; on
// a GPU it keeps cudaMalloc (a device synchronisation) out of the steady state, and the statistics
// prove it: after the first steps `raw_allocs` stops growing. On the host the cache is also bounded
// by the peak: blocks in use plus blocks cached never exceed the most ever in use at once, so a
// rank's resident memory follows the tracked peak (and the memory plan) instead of growing by every
// size a run has ever freed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/core/dtype.h"

namespace mfsdp {

/// Counters of one cache since process start (never reset; take differences).
struct BlockCacheStats {
  int64_t raw_allocs = 0;       ///< raw allocations (cudaMalloc / aligned_alloc) of cacheable blocks
  int64_t reuses = 0;           ///< requests served from the cache
  int64_t raw_frees = 0;        ///< cacheable blocks given back to the raw allocator
  int64_t uncached_allocs = 0;  ///< raw allocations of blocks below the cache's minimum size
  int64_t cached_bytes = 0;     ///< bytes held in the cache now (free, not in use)
  int64_t in_use_bytes = 0;     ///< bytes of cacheable blocks handed out and not yet taken back
  int64_t peak_in_use_bytes = 0;  ///< the most in_use_bytes has been
  int64_t evictions = 0;        ///< cached blocks given back to make room under the peak bound
  int64_t resizes = 0;          ///< misses served by resizing a cached block of another size
};

/// Freed blocks keyed by exact byte size, up to `max_cached` bytes in all; blocks smaller than
/// `min_block` bypass the cache. With `bounded_by_peak`, a miss that would take in-use plus cached
/// bytes past peak_in_use_bytes first resizes the cached block of the nearest size (with `resize`)
/// and gives back others, largest first, until they fit. Thread-safe. Not copyable.
class BlockCache {
 public:
  using RawAlloc = void* (*)(size_t bytes);  ///< returns nullptr or throws on failure
  using RawFree = void (*)(void* p, size_t bytes);  ///< takes back a block of `bytes` from RawAlloc
  /// Makes a block of `old_bytes` one of `new_bytes` (possibly moved), or returns nullptr and leaves it.
  using RawResize = void* (*)(void* p, size_t old_bytes, size_t new_bytes);
  BlockCache(RawAlloc raw_alloc, RawFree raw_free, size_t min_block, size_t max_cached, bool bounded_by_peak,
             RawResize resize = nullptr);
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
  /// What a miss of `bytes` takes out of the cache under mu_ so that in-use plus cached stay within
  /// the peak (bounded_by_peak): the block of the nearest size to resize (with a RawResize) and the
  /// blocks to give back, largest first; the caller resizes and frees outside the lock.
  struct Room {
    std::pair<size_t, void*> resized{0, nullptr};
    std::vector<std::pair<size_t, void*>> freed;
  };
  Room make_room(size_t bytes);
  void note_in_use(int64_t delta);  ///< in_use_bytes += delta and its peak, under mu_

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  RawResize resize_;
  size_t min_block_, max_cached_;
  bool bounded_by_peak_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  BlockCacheStats stats_;
};

/// The process-wide cache of `device`'s Storage allocations. Host: blocks of >= 1 MiB mapped
/// directly (mmap, page aligned, so a block given back leaves the process's resident memory),
/// cached up to 4 GiB and bounded by the peak; smaller blocks 64-byte aligned from the heap,
/// uncached. CUDA: every block cached without limit (emptied and retried when the device runs out
/// of memory). Never destroyed: it outlives static tensors.
BlockCache& block_cache(Device device);

}  // namespace mfsdp
