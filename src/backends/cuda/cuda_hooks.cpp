// The CUDA DeviceHooks (core/device_hooks.h): a caching allocator (core/block_cache.h) over
// cudaMalloc, one pool per (device, locality domain), and synchronous copies and fills.
// Registered from a static initializer that calls no CUDA API, so loading liblocus on a machine
// without a GPU is harmless; the first allocation reports a clear Error.
//
// The stream rule that makes handing a freed block out again at once safe (no event per block):
// 1. An op queues all its work on the caller's stream, or on streams forked from it and joined
//    back into it before the op returns (ops/partitioned.cpp, modules/moe.cpp). So when the host
//    drops a tensor's last reference, every kernel that uses it is ordered before anything the
//    caller's stream runs next, and the block's next owner uses it only from there: on that
//    stream, or on a partition stream forked from it later.
// 2. The untagged pool (domain -1) belongs to the caller's stream. Locus drives a device from
//    one caller stream at a time (the model runs on the legacy default stream); code that
//    switches caller streams synchronizes in between (the tests do, through fetch()).
// 3. Inside a partition (between a fork and its join) scratch is taken from the partition's
//    domain (DomainPlace::allocate, as Linear::forward_partition does): domain d's blocks are
//    used on domain d's stream, so two partitions never hand each other a block in flight.
//    Weight shards live in the domain pools too; they are freed only when no forward runs.
// 4. Copies and fills first wait for the whole device, then complete before they return: a copy
//    into a reused block cannot overtake a kernel still reading it on any stream, and a copy out
//    of device memory sees all work queued before it. (Copies are not allowed inside a capture.)
// 5. Weights (module weights, shards, absorbed MLA weights, in-place reloads) are written only by
//    these copies, never by a kernel. The weight kernels (the streaming GEMM's TMA feed, the BMM
//    kernel) start as programmatic dependent launches and read their weights before waiting for
//    the kernels before them, any of which may still be running; a kernel that writes weights
//    (say, a requantization on the GPU) would need those reads moved after the wait.
// 6. Scratch inside the CUDA backend does not use this cache: cuBLASLt workspaces come from
//    cudaMallocAsync on the op's stream (stream-ordered by the driver), the NVFP4 kernel keeps
//    its own buffers.
// Graph captures: a miss calls cudaMalloc in relaxed capture mode (legal during a capture, as the
// fork/join event pool does); releasing the cache waits for the device, so it is refused while a
// cuda::Graph capture is in progress. A block handed out and freed during a capture stays with
// the captured graph until it is destroyed (capture_state.h), so no later owner shares it with
// the graph's replays.
#include <cuda_runtime_api.h>

#include <atomic>
#include <vector>

#include "backends/cuda/capture_state.h"
#include "backends/cuda/cuda_check.h"
#include "core/block_cache.h"
#include "core/device_hooks.h"

namespace locus::cuda {

namespace {

cudaMemcpyKind kind_of(Device dst, Device src) {
  if (dst.is_cuda() && src.is_cuda()) return cudaMemcpyDeviceToDevice;
  if (dst.is_cuda()) return cudaMemcpyHostToDevice;
  if (src.is_cuda()) return cudaMemcpyDeviceToHost;
  return cudaMemcpyHostToHost;
}

// cudaMalloc that a stream capture tolerates (relaxed mode for this call only). nullptr when the
// device is out of memory.
void* raw_allocate(size_t bytes, int device_index, int domain) {
  use_device(device_index);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (exchanged) cudaThreadExchangeStreamCaptureMode(&mode);
  if (e == cudaSuccess) return p;
  cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) return nullptr;
  LOCUS_THROW("CUDA allocation of ", bytes, " bytes on cuda:", device_index, " (domain ", domain,
              ") failed: ", cudaGetErrorString(e));
}

void raw_free(void* p, int) {
  // Freeing during teardown after the driver shut down is not an error worth reporting.
  if (cudaFree(p) != cudaSuccess) cudaGetLastError();
}

// Cached blocks may still be used by queued work (rule 1): wait for the device before freeing.
bool prepare_release(int device_index) {
  if (detail::capture_in_progress()) return false;
  use_device(device_index);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

// Rule 4: every copy or fill starts after all work queued on the device.
void wait_for_device(int device_index) {
  use_device(device_index);
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
}

class CudaHooks final : public DeviceHooks {
 public:
  CudaHooks() : cache_(BlockCache::Backend{"cuda", raw_allocate, raw_free, prepare_release}) {}

  // The domain selects the pool and is recorded by Tensor's Storage and the memory statistics; on a
  // driver without locality-domain memory (CUDA < 13.4) every domain is an ordinary allocation.
  void* allocate(size_t bytes, int device_index, int domain) override {
    const bool capturing = detail::capture_in_progress();
    if (capturing) {
      if (void* p = detail::reuse_capture_block(BlockCache::size_class(bytes), device_index, domain)) return p;
    }
    void* p = cache_.allocate(bytes, device_index, domain);
    if (capturing) detail::note_capture_allocation(p, BlockCache::size_class(bytes), device_index, domain);
    if (poison_ && bytes && !capturing) {
      try {
        fill_bytes(p, device_index, 0xFF, bytes);
      } catch (...) {
        cache_.deallocate(p);
        throw;
      }
    }
    return p;
  }
  void deallocate(void* ptr, size_t, int, int) override {
    if (!detail::keep_for_capture(ptr)) cache_.deallocate(ptr);
  }
  void give_back(void* ptr) { cache_.deallocate(ptr); }

  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    if (!bytes) return;
    wait_for_device(dd.is_cuda() ? dd.index : sd.index);
    LOCUS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind_of(dd, sd)));
    finish(dd);
  }
  void copy_2d(void* dst, size_t dp, Device dd, const void* src, size_t sp, Device sd, size_t row_bytes,
               size_t rows) override {
    if (!rows || !row_bytes) return;
    wait_for_device(dd.is_cuda() ? dd.index : sd.index);
    LOCUS_CUDA_CHECK(cudaMemcpy2D(dst, dp, src, sp, row_bytes, rows, kind_of(dd, sd)));
    finish(dd);
  }
  void fill_bytes(void* dst, int device_index, uint8_t value, size_t bytes) override {
    if (!bytes) return;
    wait_for_device(device_index);
    LOCUS_CUDA_CHECK(cudaMemset(dst, value, bytes));
    LOCUS_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // cudaMemset is asynchronous for device memory
  }

  CacheStats cache_stats(int device_index, int domain) const override { return cache_.stats(device_index, domain); }
  CacheStats cache_total(int device_index) const override { return cache_.total(device_index); }
  int64_t release_cache(int device_index) override { return cache_.release(device_index); }
  void set_poison_allocations(bool on) override { poison_ = on; }

 private:
  // A pageable host-to-device (or device-to-device) cudaMemcpy may return before the data has
  // landed; wait so that a kernel on any stream sees it.
  static void finish(Device dst) {
    if (dst.is_cuda()) LOCUS_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  BlockCache cache_;
  std::atomic<bool> poison_{false};
};

CudaHooks& hooks() {
  // Never destroyed: tensors may be freed during static teardown, after this file's statics.
  static auto* h = new CudaHooks();
  return *h;
}

struct Registrar {
  Registrar() { register_device_hooks(DeviceType::kCUDA, &hooks()); }
} registrar;

}  // namespace

void detail::release_capture_blocks(std::vector<void*>& blocks) {
  for (void* p : blocks) hooks().give_back(p);
  blocks.clear();
}
}  // namespace locus::cuda
