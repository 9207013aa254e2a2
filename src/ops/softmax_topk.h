// Row-wise softmax and top-k (sampling and MoE routing helpers).
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

// y[M,N] = softmax(x[M,N]) per row, in fp32 (x, y fp32; y may alias x). Any rank (rows = last
// dim). -inf entries get probability 0; a row that is all -inf gives NaN, as in PyTorch.
void softmax(const Tensor& x, const Tensor& y, const Stream& stream = {});

// Per row, the k largest values (descending) and their column indices (i32). Ties keep the
// lower index first, so the result is deterministic. NaN never wins over a number.
// x fp32 or bf16 (any rank, rows = last dim); values fp32/bf16 and indices i32/i64 of shape [..., k].
void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices, const Stream& stream = {});

}  // namespace locus::ops
