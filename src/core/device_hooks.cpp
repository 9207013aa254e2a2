#include "core/device_hooks.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "core/error.h"

namespace locus {
namespace {

// Host memory: 64-byte aligned so vector loads never straddle a cache line.
class CpuHooks final : public DeviceHooks {
 public:
  void* allocate(size_t bytes, int, int) override {
    if (bytes == 0) bytes = 1;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) LOCUS_THROW("host allocation of ", bytes, " bytes failed");
    if (poison_) std::memset(p, 0xFF, rounded);
    return p;
  }
  void set_poison_allocations(bool on) override { poison_ = on; }
  void deallocate(void* ptr, size_t, int, int) override { std::free(ptr); }
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    LOCUS_CHECK(dd.is_cpu() && sd.is_cpu(), "CPU copy hook got a non-CPU side");
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_2d(void* dst, size_t dp, Device dd, const void* src, size_t sp, Device sd, size_t row_bytes,
               size_t rows) override {
    LOCUS_CHECK(dd.is_cpu() && sd.is_cpu(), "CPU copy hook got a non-CPU side");
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dp, static_cast<const char*>(src) + r * sp, row_bytes);
  }
  void fill_bytes(void* dst, int, uint8_t value, size_t bytes) override { std::memset(dst, value, bytes); }

 private:
  std::atomic<bool> poison_{false};
};

struct Registry {
  std::array<DeviceHooks*, 2> hooks{};
  std::mutex stats_mu;
  std::map<std::tuple<int, int, int>, MemoryStats> stats;  // (device type, index, domain)
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: storage may be freed during static teardown
    static CpuHooks cpu;
    reg->hooks[static_cast<int>(DeviceType::kCPU)] = &cpu;
    return reg;
  }();
  return *r;
}

}  // namespace

void register_device_hooks(DeviceType type, DeviceHooks* hooks) {
  registry().hooks[static_cast<int>(type)] = hooks;
}

bool has_device_hooks(DeviceType type) { return registry().hooks[static_cast<int>(type)] != nullptr; }

DeviceHooks& device_hooks(DeviceType type) {
  DeviceHooks* h = registry().hooks[static_cast<int>(type)];
  if (!h) {
    LOCUS_THROW("no backend for device type '", type == DeviceType::kCUDA ? "cuda" : "cpu",
                "' is available in this build (was Locus built with CUDA?)");
  }
  return *h;
}

namespace {
thread_local int t_default_domain = -1;
}  // namespace

int default_allocation_domain() { return t_default_domain; }
AllocationDomainScope::AllocationDomainScope(int domain) : previous_(t_default_domain) { t_default_domain = domain; }
AllocationDomainScope::~AllocationDomainScope() { t_default_domain = previous_; }

void record_allocation(Device device, int domain, int64_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.stats_mu);
  MemoryStats& s = r.stats[{static_cast<int>(device.type), device.index, domain}];
  s.live_bytes += bytes;
  if (s.live_bytes > s.peak_bytes) s.peak_bytes = s.live_bytes;
}

MemoryStats memory_stats(Device device, int domain) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.stats_mu);
  auto it = r.stats.find({static_cast<int>(device.type), device.index, domain});
  return it == r.stats.end() ? MemoryStats{} : it->second;
}

int64_t live_bytes_total(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.stats_mu);
  int64_t total = 0;
  for (const auto& [key, s] : r.stats) {
    if (std::get<0>(key) == static_cast<int>(device.type) && std::get<1>(key) == device.index)
      total += s.live_bytes;
  }
  return total;
}

CacheStats device_cache_stats(Device device, int domain) {
  if (!has_device_hooks(device.type)) return {};
  return device_hooks(device.type).cache_stats(device.index, domain);
}

CacheStats device_cache_total(Device device) {
  if (!has_device_hooks(device.type)) return {};
  return device_hooks(device.type).cache_total(device.index);
}

void set_poison_allocations(bool on) {
  for (DeviceHooks* h : registry().hooks)
    if (h) h->set_poison_allocations(on);
}

int64_t release_device_cache(Device device) {
  if (!has_device_hooks(device.type)) return 0;
  return device_hooks(device.type).release_cache(device.index);
}

}  // namespace locus
