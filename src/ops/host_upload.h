// Host-to-device uploads that a CUDA graph can hold: page-locked staging tensors on the host and
// copies from them queued on a stream. A decode graph (runtime/decode_graphs.h) starts with such a
// copy of its tables, so a step needs no synchronous copy before its replay. The inverse of
// ops/host_readback.h.
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

// A contiguous CPU tensor for staging uploads to `device`: page-locked when `device` is a CUDA
// device (a copy from it is asynchronous and capturable); ordinary memory for the CPU.
Tensor host_staging(const Shape& shape, DType dtype, Device device);

// Queues dst = src on `stream` (src: contiguous on the CPU; dst: contiguous, same shape and dtype).
// From a host_staging tensor to a CUDA device the copy is asynchronous: src must stay unchanged
// until the stream has run it (see synchronize). On the CPU it is a plain copy.
void upload(const Tensor& src, const Tensor& dst, const Stream& stream = {});

// Waits until the work queued on `stream` (of `device`) has run; nothing to wait for on the CPU.
void synchronize(Device device, const Stream& stream = {});

}  // namespace locus::ops
