// Batched GEMM for MLA weight absorption: y[b] = a[b] * b_mat[b] for b in [0, B).
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

// a: bf16 [B,M,K] with stride(2) == 1 (any batch and row strides: a may be a transposed view
//    of a [T, H, D] activation);
// b: bf16 [B,K,N] with either stride(2) == 1 (row-major K x N) or stride(1) == 1 (a transposed
//    view of an [N, K] per-head weight);
// y: bf16 or fp32 [B,M,N] with stride(2) == 1. fp32 accumulation, fixed K order on the CPU.
void bmm(const Tensor& a, const Tensor& b, const Tensor& y, const Stream& stream = {});

}  // namespace locus::ops
