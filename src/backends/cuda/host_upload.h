// The CUDA side of ops/host_upload.h. No CUDA header here.
#pragma once
#include <cstddef>

#include "core/tensor.h"

namespace locus::cuda {

// A CPU tensor in page-locked memory (cudaMallocHost), freed with its last reference.
Tensor pinned_host_empty(const Shape& shape, DType dtype);
// Host -> device on `stream`, capturable when src is page-locked: then a kernel reads src through
// its mapped address (copy_by_kernel); else cudaMemcpyAsync.
void upload(const Tensor& src, const Tensor& dst, void* stream);
// Copies `bytes` from src to dst in a kernel on `stream` (host_upload_kernel.cu); either may be
// page-locked host memory given by its device-side (mapped) address.
void copy_by_kernel(const void* src, void* dst, size_t bytes, void* stream);
void stream_synchronize(int device_index, void* stream);

}  // namespace locus::cuda
