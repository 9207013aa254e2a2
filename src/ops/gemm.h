// Dense BF16 matrix products, the core op of every Linear.
//
// Conventions for all ops in this folder:
// - Tensors carry their device; the op runs on the backend of that device. `stream` names the
//   CUDA stream or CPU thread pool to run on (Stream{} = the device's default).
// - Outputs are passed as tensors (views) and are the only memory written. An output may be a
//   column slice of a wider tensor (row stride > its width): partitioned ops rely on that.
// - Shapes and dtypes are validated; a mismatch throws locus::Error naming the operand.
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

// y[M,N] = x[M,K] * w[N,K]^T (+ bias[N]), fp32 accumulation.
// x: bf16 row-major (stride(1) == 1, stride(0) >= K); w: bf16 row-major [N,K];
// bias: undefined, or bf16/fp32 [N]; y: bf16 or fp32 [M,N] with stride(1) == 1.
// On the CPU every output element is one dot product over K in a fixed order, so a column
// slice computed alone is bit-identical to the same columns of the full product.
void gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Stream& stream = {});

// Fused SwiGLU over a FUSED_GATE_UP weight: w_gate_up [2I, K], rows [0, I) gate, [I, 2I) up.
// y[M,I] = silu(x wg^T) * (x wu^T), computed from the fp32 accumulators and rounded once.
void gemm_swiglu(const Tensor& x, const Tensor& w_gate_up, const Tensor& y, const Stream& stream = {});

// Unfused SwiGLU: gate_up [M, 2I] (gate in columns [0, I), up in [I, 2I)) -> y [M, I].
void swiglu(const Tensor& gate_up, const Tensor& y, const Stream& stream = {});

}  // namespace locus::ops
