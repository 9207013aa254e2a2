// Internal to the CUDA backend: error checks that turn CUDA / cuBLAS / driver failures into
// locus::Error with the call, the error name and its description.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "core/error.h"

#define LOCUS_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    cudaError_t locus_err_ = (call);                                                            \
    if (locus_err_ != cudaSuccess) {                                                            \
      LOCUS_THROW("CUDA call ", #call, " failed: ", cudaGetErrorName(locus_err_), " (",         \
                  cudaGetErrorString(locus_err_), ")");                                         \
    }                                                                                           \
  } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define LOCUS_CUDA_CHECK_LAUNCH(what) LOCUS_CUDA_CHECK_NAMED(cudaGetLastError(), what)
#define LOCUS_CUDA_CHECK_NAMED(call, what)                                                      \
  do {                                                                                          \
    cudaError_t locus_err_ = (call);                                                            \
    if (locus_err_ != cudaSuccess) {                                                            \
      LOCUS_THROW(what, " failed: ", cudaGetErrorName(locus_err_), " (",                        \
                  cudaGetErrorString(locus_err_), ")");                                         \
    }                                                                                           \
  } while (0)

namespace locus::cuda {

// Makes `index` the calling thread's current device (cheap when it already is).
inline void use_device(int index) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != index) LOCUS_CUDA_CHECK(cudaSetDevice(index));
}

// cudaDeviceGetAttribute, asked once per device and attribute (the kernels' dispatch asks on
// every call).
inline int device_attribute(int device, cudaDeviceAttr attribute) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find({device, static_cast<int>(attribute)});
  if (it != known.end()) return it->second;
  int value = 0;
  LOCUS_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return known[{device, static_cast<int>(attribute)}] = value;
}

// The most dynamic shared memory a launch of `kernel` may ask for on the current device: the
// device's opt-in limit less the kernel's static shared memory (as the compiler padded it). Asked
// once per device and kernel.
inline int max_dynamic_smem(const void* kernel) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> known;
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find({dev, kernel});
  if (it != known.end()) return it->second;
  cudaFuncAttributes attr{};
  LOCUS_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const int bytes = device_attribute(dev, cudaDevAttrMaxSharedMemoryPerBlockOptin) - static_cast<int>(attr.sharedSizeBytes);
  return known[{dev, kernel}] = bytes;
}

// Sets a kernel's attribute `attribute` on the current device to at least `value` (values <= 0
// are left alone): once per device, kernel and attribute until a larger value is asked for (it
// only grows, so concurrent launches that need less stay valid).
inline void raise_kernel_attribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> set_to;
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  int& cur = set_to[{dev, kernel, static_cast<int>(attribute)}];
  if (value <= cur) return;
  LOCUS_CUDA_CHECK(cudaFuncSetAttribute(kernel, attribute, value));
  cur = value;
}

// Raises a kernel's dynamic shared-memory limit to at least `bytes` on the current device.
inline void raise_dynamic_smem_limit(const void* kernel, int bytes) {
  raise_kernel_attribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Asks that an SM running `kernel` give shared memory its largest carveout: a kernel that leaves
// part of the SM's shared memory to the next launch's CTAs needs that part to exist.
inline void prefer_most_shared_memory(const void* kernel) {
  raise_kernel_attribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

}  // namespace locus::cuda
