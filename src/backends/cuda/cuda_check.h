// Internal to the CUDA backend: error checks that turn CUDA / cuBLAS / driver failures into
// locus::Error with the call, the error name and its description.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <set>
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

// Raises a kernel's dynamic shared-memory limit to at least `bytes` on the current device (the
// limit is an attribute of the kernel in each device's context; it only grows, so concurrent
// launches with smaller needs stay valid).
inline void raise_dynamic_smem_limit(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> limits;
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  int& cur = limits[{dev, kernel}];
  if (bytes <= cur) return;
  LOCUS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  cur = bytes;
}

// Asks that an SM running `kernel` give shared memory its largest carveout (once per device and
// kernel): a kernel that leaves part of the SM's shared memory to the next launch's CTAs needs
// that part to exist.
inline void prefer_most_shared_memory(const void* kernel) {
  static std::mutex mu;
  static std::set<std::pair<int, const void*>> done;
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert({dev, kernel}).second) return;
  LOCUS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
}

}  // namespace locus::cuda
