// The memory services a device backend provides to core: allocation, copies and fills.
// The CPU hooks are built in; the CUDA backend registers its own when it is linked in, so core
// never includes a CUDA header. Every allocation is tagged with a locality domain (-1 = none)
// and counted, so tests can prove that a full weight was released after localization.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace locus {

// A caching allocator's view of one device and domain (core/block_cache.h). Backends without a
// cache (the CPU) report zeros.
struct CacheStats {
  int64_t used_bytes = 0;    // blocks handed out (class sizes: at least the bytes asked for)
  int64_t cached_bytes = 0;  // freed blocks kept for reuse
  int64_t hits = 0;          // allocations served from the cache
  int64_t misses = 0;        // allocations that went to the raw allocator
};

class DeviceHooks {
 public:
  virtual ~DeviceHooks() = default;
  virtual void* allocate(size_t bytes, int device_index, int domain) = 0;
  virtual void deallocate(void* ptr, size_t bytes, int device_index, int domain) = 0;
  // Copies `bytes` between any two places where at least one side is this backend's device.
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) = 0;
  // 2-D copy: `rows` rows of `row_bytes`, with pitches in bytes.
  virtual void copy_2d(void* dst, size_t dst_pitch, Device dst_dev, const void* src, size_t src_pitch,
                       Device src_dev, size_t row_bytes, size_t rows) = 0;
  virtual void fill_bytes(void* dst, int device_index, uint8_t value, size_t bytes) = 0;
  // Caching allocators: statistics, and freeing the cached (unused) blocks of a device.
  virtual CacheStats cache_stats(int /*device_index*/, int /*domain*/) const { return {}; }
  virtual CacheStats cache_total(int /*device_index*/) const { return {}; }  // all domains
  virtual int64_t release_cache(int /*device_index*/) { return 0; }  // bytes given back
  // Test aid: while on, every allocation is filled with 0xFF bytes (NaN in every float dtype)
  // before it is handed out, so an op that leaves part of its output unwritten shows NaN instead
  // of stale values from a reused block. Slow (the CUDA hooks wait for the device).
  virtual void set_poison_allocations(bool on) = 0;
};

// Registration (the CUDA backend calls this from a static initializer in liblocus).
void register_device_hooks(DeviceType type, DeviceHooks* hooks);
// Throws an Error naming the device type when no backend for it was built or registered.
DeviceHooks& device_hooks(DeviceType type);
bool has_device_hooks(DeviceType type);

// The domain an allocation whose caller names none (-1) is tagged with on this thread: -1, or
// the one the innermost live AllocationDomainScope of the thread set. Work queued on a second
// stream (ops::SideStream) takes its scratch, and that of every op it calls, from a pool of its
// own this way, so that no block it frees while its kernels run is handed to the caller's stream
// (the CUDA allocator's stream rules, backends/cuda/cuda_hooks.cpp).
int default_allocation_domain();
class AllocationDomainScope {
 public:
  explicit AllocationDomainScope(int domain);
  ~AllocationDomainScope();
  AllocationDomainScope(const AllocationDomainScope&) = delete;
  AllocationDomainScope& operator=(const AllocationDomainScope&) = delete;

 private:
  int previous_;
};

// Live bytes allocated through Tensor storage, per device type and domain (-1 = untagged).
struct MemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};
MemoryStats memory_stats(Device device, int domain);
int64_t live_bytes_total(Device device);  // all domains of the device together
void record_allocation(Device device, int domain, int64_t bytes);  // +bytes or -bytes

// The device backend's allocation cache (zeros / no-op where the backend has none or is not built).
// memory_stats above counts live tensor bytes; these count the allocator's blocks.
CacheStats device_cache_stats(Device device, int domain);
CacheStats device_cache_total(Device device);  // all domains of the device
// Gives the cached blocks of `device` back to the driver (e.g. after loading, before sizing the
// KV cache from the free memory). Returns the bytes released.
int64_t release_device_cache(Device device);
// DeviceHooks::set_poison_allocations for every registered backend.
void set_poison_allocations(bool on);

}  // namespace locus
