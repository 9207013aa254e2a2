#include "core/block_cache.h"

#include <bit>

#include "core/error.h"

namespace locus {
namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kLargeStep = size_t{2} << 20;   // 2 MiB

std::string mib(int64_t bytes) { return str(static_cast<double>(bytes) / (1 << 20), " MiB"); }

}  // namespace

BlockCache::BlockCache(Backend backend) : backend_(std::move(backend)) {
  LOCUS_CHECK(backend_.allocate && backend_.free, "BlockCache needs a raw allocate and free");
}

size_t BlockCache::size_class(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes > kSmallLimit) return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
  const size_t step = std::max(std::bit_floor(bytes) / 4, kMinBlock);  // bit_floor(b) <= b < 2 bit_floor(b)
  return (bytes + step - 1) / step * step;
}

void* BlockCache::take_cached(Pool& pool, size_t want, size_t* got) {
  auto it = pool.free_blocks.lower_bound(want);
  if (it == pool.free_blocks.end() || it->first > want + want / 4) return nullptr;
  void* p = it->second;
  *got = it->first;
  pool.free_blocks.erase(it);
  pool.stats.cached_bytes -= static_cast<int64_t>(*got);
  return p;
}

void* BlockCache::allocate(size_t bytes, int device_index, int domain) {
  const size_t want = size_class(bytes);
  const Key key{device_index, domain};
  std::lock_guard<std::mutex> lock(mu_);
  Pool& pool = pools_[key];
  size_t block = want;
  void* p = take_cached(pool, want, &block);
  if (p) {
    ++pool.stats.hits;
  } else {
    p = backend_.allocate(want, device_index, domain);
    if (!p && release_locked(device_index) > 0) p = backend_.allocate(want, device_index, domain);
    if (!p) {
      int64_t device_used = 0;
      for (const auto& [k, other] : pools_) device_used += k.first == device_index ? other.stats.used_bytes : 0;
      LOCUS_THROW("out of memory: allocating ", bytes, " bytes (a ", mib(static_cast<int64_t>(want)), " block) on ",
                  backend_.device_kind, ":", device_index, " (domain ", domain,
                  ") failed, also after releasing the allocation cache; live blocks hold ", mib(pool.stats.used_bytes),
                  " in this domain, ", mib(device_used), " on the device");
    }
    ++pool.stats.misses;
  }
  live_[p] = {block, key};
  pool.stats.used_bytes += static_cast<int64_t>(block);
  return p;
}

void BlockCache::deallocate(void* ptr) noexcept {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    try {
      backend_.free(ptr, -1);
    } catch (...) {
    }
    return;
  }
  const Live l = it->second;
  live_.erase(it);
  Pool& pool = pools_[l.key];
  pool.stats.used_bytes -= static_cast<int64_t>(l.bytes);
  pool.stats.cached_bytes += static_cast<int64_t>(l.bytes);
  pool.free_blocks.emplace(l.bytes, ptr);
}

int64_t BlockCache::release_locked(int device_index) {
  bool any = false;
  for (const auto& [key, pool] : pools_) any = any || (key.first == device_index && !pool.free_blocks.empty());
  if (!any) return 0;
  if (backend_.prepare_release && !backend_.prepare_release(device_index)) return 0;
  int64_t freed = 0;
  for (auto& [key, pool] : pools_) {
    if (key.first != device_index) continue;
    for (const auto& [bytes, p] : pool.free_blocks) {
      backend_.free(p, device_index);
      freed += static_cast<int64_t>(bytes);
    }
    pool.free_blocks.clear();
    pool.stats.cached_bytes = 0;
  }
  return freed;
}

int64_t BlockCache::release(int device_index) {
  std::lock_guard<std::mutex> lock(mu_);
  return release_locked(device_index);
}

CacheStats BlockCache::stats(int device_index, int domain) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find({device_index, domain});
  return it == pools_.end() ? CacheStats{} : it->second.stats;
}

CacheStats BlockCache::total(int device_index) const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheStats t;
  for (const auto& [key, pool] : pools_) {
    if (key.first != device_index) continue;
    t.used_bytes += pool.stats.used_bytes;
    t.cached_bytes += pool.stats.cached_bytes;
    t.hits += pool.stats.hits;
    t.misses += pool.stats.misses;
  }
  return t;
}

}  // namespace locus
