// Internal to the CUDA backend: the cuBLASLt BF16 GEMMs on raw weight pointers, shared by the BF16
// ops (cuda_ops.cpp) and the NVFP4 ops' large-M path (a weight dequantized into scratch).
#pragma once
#include <cuda_runtime_api.h>

#include "core/tensor.h"

namespace locus::cuda::detail {

// A bf16 row-major weight [n, k] with row stride ld (elements), and an optional device-side
// scale applied to the product: y = alpha * x w^T (+ bias).
struct Bf16Weight {
  const void* data = nullptr;
  int64_t ld = 0;
  int64_t n = 0;
  const float* alpha_device = nullptr;  // nullptr: alpha = 1
};

// y[M, n] = alpha * x[M, K] w^T (+ bias[n]); x bf16 row-major, y bf16/fp32 (a column slice is fine),
// bias bf16/fp32 or undefined. Operands are checked by the callers.
void bf16_gemm(const Tensor& x, const Bf16Weight& w, const Tensor& bias, const Tensor& y, cudaStream_t stream);
// y[M, n/2] = silu(g) * u with [g | u] = alpha * x w^T computed in fp32 scratch (w = [gate; up]).
void bf16_gemm_swiglu(const Tensor& x, const Bf16Weight& w, const Tensor& y, cudaStream_t stream);

}  // namespace locus::cuda::detail
