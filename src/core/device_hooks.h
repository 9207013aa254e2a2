// The memory services a device backend provides to core: allocation, copies and fills.
// The CPU hooks are built in; the CUDA backend registers its own when it is linked in, so core
// never includes a CUDA header. Every allocation is tagged with a locality domain (-1 = none)
// and counted, so tests can prove that a full weight was released after localization.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace locus {

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
};

// Registration (the CUDA backend calls this from a static initializer in liblocus).
void register_device_hooks(DeviceType type, DeviceHooks* hooks);
// Throws an Error naming the device type when no backend for it was built or registered.
DeviceHooks& device_hooks(DeviceType type);
bool has_device_hooks(DeviceType type);

// Live bytes allocated through Tensor storage, per device type and domain (-1 = untagged).
struct MemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};
MemoryStats memory_stats(Device device, int domain);
int64_t live_bytes_total(Device device);  // all domains of the device together
void record_allocation(Device device, int domain, int64_t bytes);  // +bytes or -bytes

}  // namespace locus
