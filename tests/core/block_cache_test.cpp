// BlockCache (core/block_cache.h) over a fake raw allocator with a byte limit: size classes,
// reuse per (device, domain), best fit, release, out-of-memory retry and the error message.
#include "core/block_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>

#include "runtime/runtime_test_util.h"
#include "test_util.h"

namespace locus {
namespace {

// malloc-backed raw allocator that refuses to go over `limit` bytes in total.
struct FakeDevice {
  size_t limit = SIZE_MAX;
  size_t in_use = 0;
  int raw_allocs = 0, raw_frees = 0;
  bool allow_release = true;
  std::map<void*, size_t> blocks;

  BlockCache::Backend backend() {
    BlockCache::Backend b;
    b.device_kind = "fake";
    b.allocate = [this](size_t bytes, int, int) -> void* {
      if (in_use + bytes > limit) return nullptr;
      void* p = std::malloc(bytes);
      blocks[p] = bytes;
      in_use += bytes;
      ++raw_allocs;
      return p;
    };
    b.free = [this](void* p, int) {
      auto it = blocks.find(p);
      if (it != blocks.end()) {
        in_use -= it->second;
        blocks.erase(it);
      }
      std::free(p);
      ++raw_frees;
    };
    b.prepare_release = [this](int) { return allow_release; };
    return b;
  }
  ~FakeDevice() {
    for (auto& [p, n] : blocks) std::free(p);
  }
};

TEST(BlockCache, SizeClassesRoundUpByAtMostAQuarterOrTwoMiB) {
  EXPECT_EQ(BlockCache::size_class(0), 512u);
  EXPECT_EQ(BlockCache::size_class(512), 512u);
  EXPECT_EQ(BlockCache::size_class(513), 1024u);
  EXPECT_EQ(BlockCache::size_class(1025), 1536u);
  EXPECT_EQ(BlockCache::size_class(2049), 2560u);
  EXPECT_EQ(BlockCache::size_class(4097), 5120u);
  EXPECT_EQ(BlockCache::size_class(1 << 20), size_t{1} << 20);
  EXPECT_EQ(BlockCache::size_class((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(BlockCache::size_class(5u << 20), size_t{6} << 20);
  std::mt19937_64 rng(testing::fresh_seed());
  for (int i = 0; i < 20000; ++i) {
    const size_t b = rng() % (size_t{64} << 20) >> (rng() % 24);
    const size_t c = BlockCache::size_class(b);
    ASSERT_GE(c, b) << b;
    ASSERT_EQ(c % 512, 0u) << b;
    if (b <= (1u << 20)) ASSERT_LE(c, b + std::max<size_t>(512, b / 4)) << b;
    else ASSERT_LT(c, b + (2u << 20)) << b;
  }
}

TEST(BlockCache, FreedBlocksAreReusedPerDeviceAndDomain) {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  void* a = cache.allocate(1000, 0, -1);
  EXPECT_EQ(cache.stats(0, -1).used_bytes, 1024);
  cache.deallocate(a);
  EXPECT_EQ(cache.stats(0, -1).used_bytes, 0);
  EXPECT_EQ(cache.stats(0, -1).cached_bytes, 1024);
  // Same class: the cached block, no raw allocation.
  EXPECT_EQ(cache.allocate(900, 0, -1), a);
  EXPECT_EQ(dev.raw_allocs, 1);
  EXPECT_EQ(cache.stats(0, -1).hits, 1);
  EXPECT_EQ(cache.stats(0, -1).misses, 1);
  EXPECT_EQ(cache.stats(0, -1).cached_bytes, 0);
  cache.deallocate(a);
  // Another domain or device never gets it.
  void* b = cache.allocate(1000, 0, 1);
  void* c = cache.allocate(1000, 1, -1);
  EXPECT_NE(b, a);
  EXPECT_NE(c, a);
  EXPECT_EQ(dev.raw_allocs, 3);
  EXPECT_EQ(cache.stats(0, 1).used_bytes, 1024);
  EXPECT_EQ(cache.total(0).used_bytes, 1024);
  EXPECT_EQ(cache.total(0).cached_bytes, 1024);
  cache.deallocate(b);
  cache.deallocate(c);
}

TEST(BlockCache, BestFitTakesABlockAtMostAQuarterLarger) {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  void* big = cache.allocate(4096, 0, -1);
  cache.deallocate(big);
  void* small = cache.allocate(2048, 0, -1);  // 4096 is twice the class: not taken
  EXPECT_NE(small, big);
  void* near = cache.allocate(3500, 0, -1);  // class 3584: the 4096 block fits within 25%
  EXPECT_EQ(near, big);
  EXPECT_EQ(cache.stats(0, -1).used_bytes, 2048 + 4096);
  cache.deallocate(small);
  cache.deallocate(near);
  EXPECT_EQ(cache.stats(0, -1).cached_bytes, 2048 + 4096);
}

TEST(BlockCache, ReleaseFreesOnlyCachedBlocksOfTheDevice) {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  void* live = cache.allocate(3 << 20, 0, -1);
  void* d0 = cache.allocate(1 << 20, 0, 0);
  void* d1 = cache.allocate(5000, 0, 1);
  void* other = cache.allocate(1 << 20, 1, 0);
  cache.deallocate(d0);
  cache.deallocate(d1);
  cache.deallocate(other);
  dev.allow_release = false;  // e.g. during a graph capture: nothing is freed
  EXPECT_EQ(cache.release(0), 0);
  EXPECT_EQ(dev.raw_frees, 0);
  dev.allow_release = true;
  EXPECT_EQ(cache.release(0), (1 << 20) + 5120);
  EXPECT_EQ(dev.raw_frees, 2);
  EXPECT_EQ(cache.total(0).cached_bytes, 0);
  EXPECT_EQ(cache.total(0).used_bytes, 4 << 20);
  EXPECT_EQ(cache.stats(1, 0).cached_bytes, 1 << 20);  // device 1 untouched
  cache.deallocate(live);
}

TEST(BlockCache, OutOfMemoryReleasesTheCacheRetriesOnceThenNamesSizeDeviceAndDomain) {
  FakeDevice dev;
  dev.limit = 8 << 20;
  BlockCache cache(dev.backend());
  void* a = cache.allocate(6 << 20, 0, 0);
  cache.deallocate(a);  // 6 MiB cached in domain 0
  // Domain 1 cannot take domain 0's block; the raw allocation fails, the cache is released, the retry succeeds.
  void* b = cache.allocate(4 << 20, 0, 1);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(dev.raw_frees, 1);
  EXPECT_EQ(cache.total(0).cached_bytes, 0);
  testing::expect_error([&] { cache.allocate(5 << 20, 0, 3); },
                        {"out of memory", std::to_string(5 << 20) + " bytes", "fake:0", "domain 3"});
  cache.deallocate(b);
}

TEST(BlockCache, UnknownPointerGoesToTheRawFree) {
  FakeDevice dev;
  BlockCache cache(dev.backend());
  void* p = dev.backend().allocate(64, 0, -1);
  cache.deallocate(p);
  EXPECT_EQ(dev.raw_frees, 1);
  cache.deallocate(nullptr);
  EXPECT_EQ(dev.raw_frees, 1);
}

}  // namespace
}  // namespace locus
