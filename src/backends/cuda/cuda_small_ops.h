// The CUDA backend's small ops (RMSNorm, add, cast, embedding, RoPE, softmax, top-k), called by
// the dispatchers in src/ops/ when the tensors live on a CUDA device. Same contracts as the ops/
// headers (norm.h, rope.h, softmax_topk.h); operands arrive validated (shapes, dtypes, devices,
// aliasing). `stream` is a cudaStream_t (nullptr = the legacy default stream). Every function
// only enqueues kernels on `stream`: no allocation, no copy, no synchronization, so they can be
// captured in a CUDA graph. No CUDA header is included here, so host code can include this file
// under #if defined(LOCUS_WITH_CUDA).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace locus::cuda {

void rmsnorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, void* stream);
// One kernel: x += r (r of x's dtype), then y = rmsnorm(x).
void add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& weight, float eps, const Tensor& y, void* stream);
void add(const Tensor& a, const Tensor& b, const Tensor& y, void* stream);
void cast(const Tensor& x, const Tensor& y, void* stream);
// ids stay on the device and are never read back: a row whose id is outside [0, vocab) is NaN.
void embedding(const Tensor& table, const Tensor& ids, const Tensor& y, void* stream);

// In place on x [T, H, dim] or [T, dim]; cos/sin fp32 [P, dim / 2] (an ops::RopeTable's tensors,
// on the device). A position outside [0, P) turns that token's rotated elements into NaN.
void apply_rope(const Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, bool interleaved,
                void* stream);

void softmax(const Tensor& x, const Tensor& y, void* stream);
void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices, void* stream);

}  // namespace locus::cuda
