// The BMM benchmarks' reference: plain cuBLAS (strided batched GEMM, default algorithm) on MLA's
// absorbed products, y[h] = a[h] w[h]^T for h < H.
#pragma once
#include <cublas_v2.h>

#include "core/tensor.h"

namespace locus::bench {

// w: bf16 [H, N, K], contiguous; a: bf16 [H, M, K] and y: bf16 [H, M, N], views whose last dim is
// contiguous (MLA's [M, H, D] buffers transposed). On the handle's stream.
inline void cublas_mla_bmm(cublasHandle_t cub, const Tensor& w, const Tensor& a, const Tensor& y) {
  const float alpha = 1.f, beta = 0.f;
  const int H = static_cast<int>(w.size(0)), N = static_cast<int>(w.size(1)), K = static_cast<int>(w.size(2));
  const int M = static_cast<int>(a.size(1));
  cublasGemmStridedBatchedEx(cub, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w.data_ptr(), CUDA_R_16BF, K,
                             int64_t{N} * K, a.data_ptr(), CUDA_R_16BF, static_cast<int>(a.stride(1)), a.stride(0), &beta,
                             y.data_ptr(), CUDA_R_16BF, static_cast<int>(y.stride(1)), y.stride(0), H, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT);
}

}  // namespace locus::bench
