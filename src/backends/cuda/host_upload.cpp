// Page-locked staging tensors and asynchronous uploads from them (host_upload.h).
#include "backends/cuda/host_upload.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/env_settings.h"

namespace locus::cuda {

Tensor pinned_host_empty(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* p = nullptr;
  LOCUS_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 16));
  std::shared_ptr<void> owner(p, [](void* q) {
    if (cudaFreeHost(q) != cudaSuccess) cudaGetLastError();  // teardown after the driver: ignore
  });
  return Tensor::from_blob(p, shape, dtype, Device::cpu(), std::move(owner));
}

void upload(const Tensor& src, const Tensor& dst, void* stream) {
  LOCUS_CHECK(dst.device().is_cuda(), "cuda::upload: the destination must be on a CUDA device, got ", dst.describe());
  if (src.nbytes() == 0) return;
  use_device(dst.device().index);
  // Page-locked staging is mapped into the device's address space (unified addressing): a kernel
  // copies it. Other host memory goes through the copy engine.
  // LOCUS_UPLOAD_KERNEL=0 keeps the copy engine for every upload (for A/B timing).
  static detail::EnvToggle kernel_copies("LOCUS_UPLOAD_KERNEL", /*default_on=*/true);
  cudaPointerAttributes attr{};
  if (kernel_copies.on() && cudaPointerGetAttributes(&attr, src.data_ptr()) == cudaSuccess &&
      attr.type == cudaMemoryTypeHost && attr.devicePointer != nullptr)
    return copy_by_kernel(attr.devicePointer, dst.data_ptr(), src.nbytes(), stream);
  cudaGetLastError();  // a failed attribute query leaves nothing behind
  LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyHostToDevice,
                                   static_cast<cudaStream_t>(stream)));
}

void stream_synchronize(int device_index, void* stream) {
  use_device(device_index);
  LOCUS_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace locus::cuda
