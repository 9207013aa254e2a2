// Normalization and element-wise helpers used by the decoder layers.
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

// y[M,H] = x / sqrt(mean(x^2) + eps) * weight, computed in fp32 (x, y bf16 or fp32; weight bf16/fp32).
// Any rank (rows are all leading indices), unit last stride; y may be x itself. One rounding per
// element (Hugging Face rounds x * rsqrt to the input dtype before the weight: differs by <= 1 ulp).
void rmsnorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Stream& stream = {});

// x += r (rounded to x's dtype), then y = rmsnorm(x, weight, eps): the results of ops::add(x, r, x)
// and then ops::rmsnorm(x, weight, eps, y), bitwise, in one pass (one kernel on CUDA: a decoder
// layer's residual sum and the next norm). r has x's shape and dtype; y overlaps neither.
void add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& weight, float eps, const Tensor& y,
                 const Stream& stream = {});

// y = a + b, element-wise, same shape, any strides (bf16 or fp32, mixed; fp32 math; y may be a or b).
void add(const Tensor& a, const Tensor& b, const Tensor& y, const Stream& stream = {});

// y = x converted to y's dtype (bf16 <-> fp32 <-> fp16), same shape, any strides.
void cast(const Tensor& x, const Tensor& y, const Stream& stream = {});

// y[T, H] = table[ids[t], :]; ids i32 or i64 [T] on the table's device. On the CPU an id out of
// range throws naming it. On CUDA the ids are never read back to the host (that would
// synchronize every call): an id out of range gives a row of NaN in y, and nothing outside the
// table is read.
void embedding(const Tensor& table, const Tensor& ids, const Tensor& y, const Stream& stream = {});

}  // namespace locus::ops
