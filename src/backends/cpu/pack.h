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

// Epilogues for run_dot_panels (one batch): `res` holds an [mb, nj] panel of fp32 dot products,
// rows `ldr` apart, for output rows [m0, m0 + mb) and columns [j0, j0 + nj).
// A plain product: + bias[j] when `bias` is given, then the single rounding store.
inline auto bias_store_epilogue(const OutRows& out, const float* bias) {
  return [&out, bias](int64_t, int64_t m0, int64_t mb, int64_t j0, int64_t nj, const float* res, int64_t ldr) {
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t c = 0; c < nj; ++c) {
        float v = res[i * ldr + c];
        if (bias) v += bias[j0 + c];
        out.store(m0 + i, j0 + c, v);
      }
  };
}
// A fused gate/up panel (each row: nj gate columns, then the matching nj up columns): silu(g) * u.
inline auto swiglu_store_epilogue(const OutRows& out) {
  return [&out](int64_t, int64_t m0, int64_t mb, int64_t j0, int64_t nj, const float* res, int64_t ldr) {
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t c = 0; c < nj; ++c) out.store(m0 + i, j0 + c, silu_mul(res[i * ldr + c], res[i * ldr + nj + c]));
  };
}

}  // namespace locus::cpu::detail
