// NVFP4 products on blocks of rows of one activation matrix, as a MoE's experts run (expert e on
// the rows routed to it). On CUDA, blocks of one row count can share launches of the streaming
// kernel, several weights per launch, where one launch per expert pays a launch and a ramp each.
#pragma once
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"
#include "ops/nvfp4.h"

namespace locus::ops {

struct Nvfp4RowBlock {
  const Nvfp4Weight* w = nullptr;  // prepared for x's device
  int64_t row0 = 0;                // rows [row0, row0 + rows) of x and of y
  int64_t rows = 0;                // 0: nothing to do
};

// For every block: y[row0 + i, :] = x[row0 + i, :] dequant(w)^T for i < rows or, with swiglu,
// silu(gate) * up of a fused [2N, K] weight. x bf16 [R, K]; y bf16 or fp32 [R, N] (unit column
// stride); every block inside [0, R). A block's rows are what nvfp4_gemm / nvfp4_gemm_swiglu on
// those rows give: bitwise on the CPU (these are the calls it makes); on CUDA, where blocks share
// a launch (cuda::nvfp4_row_block_launches), equal within fp32 rounding, as the kernel then cuts
// the work differently. Errors name the block.
void nvfp4_gemm_row_blocks(const Tensor& x, const std::vector<Nvfp4RowBlock>& blocks, const Tensor& y, bool swiglu,
                           const Stream& stream = {});

}  // namespace locus::ops
