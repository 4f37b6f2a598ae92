// The caching allocator in front of raw device allocations: reuse by exact size, the cache limit,
// the retry after emptying the cache, and a steady state without raw allocations.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <stdexcept>

#include "runtime/block_cache.h"
#include "runtime/tensor.h"

using namespace mfsdp;

namespace {

// A fake raw allocator with a capacity, so out-of-memory can be provoked: it tracks the bytes it
// has handed out (by a header in front of each block).
struct FakeDevice {
  static inline size_t capacity = 0, in_use = 0;
  static void* alloc(size_t bytes) {
    if (in_use + bytes > capacity) return nullptr;
    auto* p = static_cast<size_t*>(std::malloc(bytes + sizeof(size_t)));
    *p = bytes;
    in_use += bytes;
    return p + 1;
  }
  static void* resize(void* p, size_t old_bytes, size_t new_bytes) {  // moves, as mremap may
    void* q = alloc(new_bytes);
    if (q) free(p, old_bytes);
    return q;
  }
  static void free(void* p, size_t bytes) {
    size_t* h = static_cast<size_t*>(p) - 1;
    if (*h != bytes) throw std::logic_error("freed with another size than allocated");
    in_use -= *h;
    std::free(h);
  }
};

}  // namespace

TEST_CASE("freed blocks are reused by exact size and counted", "[block_cache]") {
  FakeDevice::capacity = 1 << 20;
  BlockCache cache(FakeDevice::alloc, FakeDevice::free, 64, 1 << 20, false);
  void* a = cache.get(1000);
  void* b = cache.get(2000);
  cache.put(a, 1000);
  cache.put(b, 2000);
  CHECK(cache.stats().raw_allocs == 2);
  CHECK(cache.stats().cached_bytes == 3000);
  CHECK(cache.get(2000) == b);  // the same block back
  CHECK(cache.get(1000) == a);
  void* c = cache.get(1500);  // no block of that size: a raw allocation
  const BlockCacheStats s = cache.stats();
  CHECK(s.raw_allocs == 3);
  CHECK(s.reuses == 2);
  CHECK(s.cached_bytes == 0);
  cache.put(a, 1000);
  cache.put(b, 2000);
  cache.put(c, 1500);
  void* small = cache.get(10);  // below min_block: never cached
  cache.put(small, 10);
  CHECK(cache.stats().uncached_allocs == 1);
  CHECK(cache.stats().cached_bytes == 4500);
  cache.clear();
  CHECK(cache.stats().cached_bytes == 0);
  CHECK(cache.stats().raw_frees == 3);
  CHECK(FakeDevice::in_use == 0);
}

TEST_CASE("the cache holds at most max_cached bytes", "[block_cache]") {
  FakeDevice::capacity = 1 << 20;
  BlockCache cache(FakeDevice::alloc, FakeDevice::free, 1, 2500, false);
  void* a = cache.get(1000);
  void* b = cache.get(2000);
  cache.put(a, 1000);
  cache.put(b, 2000);  // would exceed 2500: freed at once
  CHECK(cache.stats().cached_bytes == 1000);
  CHECK(cache.stats().raw_frees == 1);
  CHECK(FakeDevice::in_use == 1000);
  cache.clear();
}

TEST_CASE("bounded by the peak, in-use plus cached bytes never exceed the most ever in use", "[block_cache]") {
  FakeDevice::capacity = 1 << 20;
  BlockCache cache(FakeDevice::alloc, FakeDevice::free, 1, 1 << 20, true);
  auto held = [&] { return cache.stats().in_use_bytes + cache.stats().cached_bytes; };
  void* a = cache.get(1000);
  void* b = cache.get(3000);  // peak 4000 in use
  CHECK(cache.stats().peak_in_use_bytes == 4000);
  cache.put(a, 1000);
  cache.put(b, 3000);
  CHECK(held() == 4000);
  void* c = cache.get(2000);  // a miss: 2000 + 4000 cached > 4000, so the 3000 block goes
  CHECK(cache.stats().evictions == 1);
  CHECK(cache.stats().cached_bytes == 1000);
  CHECK(held() == 3000);
  void* d = cache.get(1000);  // a hit: the 1000 block comes back, nothing evicted
  CHECK(d == a);
  void* e = cache.get(1500);  // in use 4500: a new peak, and nothing is left to evict
  CHECK(cache.stats().peak_in_use_bytes == 4500);
  CHECK(held() == 4500);
  CHECK(FakeDevice::in_use == 4500);  // the device holds exactly the peak
  for (auto [p, n] : {std::pair{c, 2000}, {d, 1000}, {e, 1500}}) cache.put(p, static_cast<size_t>(n));
  void* f = cache.get(2500);  // 2500 + 4500 cached > 4500: the two largest cached blocks go
  CHECK(cache.stats().evictions == 3);
  CHECK(cache.stats().cached_bytes == 1000);
  CHECK(FakeDevice::in_use == 3500);
  cache.put(f, 2500);
  cache.clear();
  CHECK(FakeDevice::in_use == 0);
  CHECK(cache.stats().in_use_bytes == 0);
}

TEST_CASE("bounded by the peak with a resize, a miss reshapes the cached block of the nearest size", "[block_cache]") {
  FakeDevice::capacity = 1 << 20;
  BlockCache cache(FakeDevice::alloc, FakeDevice::free, 1, 1 << 20, true, FakeDevice::resize);
  void* a = cache.get(1000);
  void* b = cache.get(3000);
  void* c = cache.get(5000);  // peak 9000
  cache.put(a, 1000);
  cache.put(b, 3000);
  cache.put(c, 5000);
  void* d = cache.get(2500);  // over the bound: the 3000 block (smallest >= 2500) becomes 2500, nothing freed
  CHECK(cache.stats().resizes == 1);
  CHECK(cache.stats().evictions == 0);
  CHECK(cache.stats().cached_bytes == 6000);
  CHECK(FakeDevice::in_use == 8500);
  void* e = cache.get(7000);  // none >= 7000: the largest (5000) grows to 7000, then 1000 goes
  CHECK(cache.stats().resizes == 2);
  CHECK(cache.stats().evictions == 1);
  CHECK(cache.stats().cached_bytes == 0);
  CHECK(cache.stats().peak_in_use_bytes == 9500);
  CHECK(FakeDevice::in_use == 9500);
  CHECK(cache.stats().raw_allocs == 3);
  cache.put(d, 2500);
  cache.put(e, 7000);
  cache.clear();
  CHECK(FakeDevice::in_use == 0);
}

TEST_CASE("out of memory empties the cache and retries once, then names the size", "[block_cache]") {
  FakeDevice::capacity = 4000;
  BlockCache cache(FakeDevice::alloc, FakeDevice::free, 1, 1 << 20, false);
  void* a = cache.get(3000);
  cache.put(a, 3000);                 // cached: the device is still full
  void* b = cache.get(2000);          // fails, cache emptied, retried: succeeds
  CHECK(b != nullptr);
  CHECK(cache.stats().raw_frees == 1);
  CHECK_THROWS_WITH(cache.get(3000), Catch::Matchers::Contains("out of memory allocating 3000 bytes"));
  cache.put(b, 2000);
  cache.clear();
  CHECK(FakeDevice::in_use == 0);
}

TEST_CASE("a repeated allocation pattern reaches a steady state without raw allocations", "[block_cache]") {
  auto step = [] {  // a step's worth of large host tensors, freed at its end
    Tensor a = Tensor::empty({1 << 19}), b = Tensor::empty({3 << 18}), c = Tensor::empty({1 << 19});
    a.zero();
    b.zero();
    c.zero();
  };
  step();
  step();
  const int64_t raw = block_cache(Device::CPU).stats().raw_allocs;
  const int64_t reuses = block_cache(Device::CPU).stats().reuses;
  for (int i = 0; i < 3; ++i) step();
  CHECK(block_cache(Device::CPU).stats().raw_allocs == raw);
  CHECK(block_cache(Device::CPU).stats().reuses == reuses + 9);
}
