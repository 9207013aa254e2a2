// The CUDA DeviceHooks (core/device_hooks.h): cudaMalloc-backed, domain-tagged allocations and
// synchronous copies. Registered from a static initializer that calls no CUDA API, so loading
// liblocus on a machine without a GPU is harmless; the first allocation reports a clear Error.
// Copies and fills are complete when they return. They are ordered after the legacy default
// stream only: work queued on non-blocking streams (the partition streams) must be joined or
// synchronized before its results are copied.
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_check.h"
#include "core/device_hooks.h"

namespace locus::cuda {
namespace {

// Makes `index` the current device for the calling thread (cheap when it already is).
void use_device(int index) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != index) LOCUS_CUDA_CHECK(cudaSetDevice(index));
}

cudaMemcpyKind kind_of(Device dst, Device src) {
  if (dst.is_cuda() && src.is_cuda()) return cudaMemcpyDeviceToDevice;
  if (dst.is_cuda()) return cudaMemcpyHostToDevice;
  if (src.is_cuda()) return cudaMemcpyDeviceToHost;
  return cudaMemcpyHostToHost;
}

class CudaHooks final : public DeviceHooks {
  // A pageable host-to-device (or device-to-device) cudaMemcpy may return before the data has
  // landed; wait so that a kernel on any stream sees it.
  static void finish(Device dst) {
    if (dst.is_cuda()) LOCUS_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

 public:
  // The domain is recorded by Tensor's Storage and the memory statistics; on a driver without
  // locality-domain memory (CUDA < 13.4) every domain is an ordinary device allocation.
  void* allocate(size_t bytes, int device_index, int domain) override {
    use_device(device_index);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();
      LOCUS_THROW("CUDA allocation of ", bytes, " bytes on cuda:", device_index, " (domain ", domain,
                  ") failed: ", cudaGetErrorString(e));
    }
    return p;
  }
  void deallocate(void* ptr, size_t, int device_index, int) override {
    if (!ptr) return;
    // Freeing during teardown after the driver shut down is not an error worth reporting.
    if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();
  }
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    if (!bytes) return;
    use_device(dd.is_cuda() ? dd.index : sd.index);
    LOCUS_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind_of(dd, sd)));
    finish(dd);
  }
  void copy_2d(void* dst, size_t dp, Device dd, const void* src, size_t sp, Device sd, size_t row_bytes,
               size_t rows) override {
    if (!rows || !row_bytes) return;
    use_device(dd.is_cuda() ? dd.index : sd.index);
    LOCUS_CUDA_CHECK(cudaMemcpy2D(dst, dp, src, sp, row_bytes, rows, kind_of(dd, sd)));
    finish(dd);
  }
  void fill_bytes(void* dst, int device_index, uint8_t value, size_t bytes) override {
    if (!bytes) return;
    use_device(device_index);
    LOCUS_CUDA_CHECK(cudaMemset(dst, value, bytes));
    LOCUS_CUDA_CHECK(cudaDeviceSynchronize());  // cudaMemset is asynchronous for device memory
  }
};

struct Registrar {
  Registrar() {
    static CudaHooks hooks;
    register_device_hooks(DeviceType::kCUDA, &hooks);
  }
} registrar;

}  // namespace
}  // namespace locus::cuda
