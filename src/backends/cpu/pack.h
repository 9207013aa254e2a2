// Conversion of activation operands to the fp32 rows the dot kernels read.
#pragma once
#include <cstdint>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "core/tensor.h"

namespace locus::cpu::detail {

// x: bf16/fp32/fp16 tensor [.., rows, K] with unit last stride (any other strides); returns its
// elements as contiguous fp32 [numel] in row-major logical order (exact conversions).
std::vector<float> pack_rows_f32(const Tensor& x, ThreadPool& pool);

// Row-major output writer for fp32 results: one rounding into y's dtype (bf16 or fp32).
struct OutRows {
  char* base;
  DType dtype;
  int64_t ld;  // row stride in elements
  explicit OutRows(const Tensor& y) : base(static_cast<char*>(y.data_ptr())), dtype(y.dtype()), ld(y.stride(0)) {}
  OutRows(const Tensor& y, int64_t ld_override)
      : base(static_cast<char*>(y.data_ptr())), dtype(y.dtype()), ld(ld_override) {}
  void store(int64_t i, int64_t j, float v) const;
  void store_at(int64_t off, float v) const;  // flat element offset
};

// silu(g) * u in fp32.
float silu_mul(float g, float u);

}  // namespace locus::cpu::detail
