// The CUDA side of ops/host_upload.h. No CUDA header here.
#pragma once
#include "core/tensor.h"

namespace locus::cuda {

// A CPU tensor in page-locked memory (cudaMallocHost), freed with its last reference.
Tensor pinned_host_empty(const Shape& shape, DType dtype);
// cudaMemcpyAsync host -> device on `stream` (capturable when src is page-locked).
void upload(const Tensor& src, const Tensor& dst, void* stream);
void stream_synchronize(int device_index, void* stream);

}  // namespace locus::cuda
