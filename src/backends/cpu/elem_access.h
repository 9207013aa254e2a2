// Scalar element access by dtype for the CPU kernels: every float format is read as fp32
// (exactly) and written from fp32 with one round-to-nearest-even.
#pragma once
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/float_convert.h"
#include "core/tensor.h"

namespace locus::cpu::detail {

inline float load_f32(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::kFP32: return static_cast<const float*>(base)[off];
    case DType::kBF16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[off]);
    case DType::kFP16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[off]);
    case DType::kFP8E4M3: return e4m3_to_f32(static_cast<const uint8_t*>(base)[off]);
    default: LOCUS_THROW("load_f32: ", dtype_name(t), " is not a float dtype");
  }
}

inline void store_f32(void* base, DType t, int64_t off, float v) {
  switch (t) {
    case DType::kFP32: static_cast<float*>(base)[off] = v; return;
    case DType::kBF16: static_cast<uint16_t*>(base)[off] = f32_to_bf16_bits(v); return;
    case DType::kFP16: static_cast<uint16_t*>(base)[off] = f32_to_f16_bits(v); return;
    case DType::kFP8E4M3: static_cast<uint8_t*>(base)[off] = f32_to_e4m3(v); return;
    default: LOCUS_THROW("store_f32: ", dtype_name(t), " is not a float dtype");
  }
}

// Row loop for a tensor whose last dimension holds the rows' elements: calls fn(row, offset)
// for every row (all leading indices, row-major order), offset in elements from data_ptr().
template <class Fn>
void for_each_row(const Tensor& t, Fn&& fn) {
  const int nd = t.dim();
  if (t.numel() == 0) return;
  if (nd <= 1) {
    fn(int64_t{0}, int64_t{0});
    return;
  }
  std::vector<int64_t> idx(static_cast<size_t>(nd - 1), 0);
  int64_t rows = 1;
  for (int d = 0; d < nd - 1; ++d) rows *= t.size(d);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; ++d) off += idx[d] * t.stride(d);
    fn(r, off);
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < t.size(d)) break;
      idx[d] = 0;
    }
  }
}

// Offset of the row with flat index `row` (leading dims, row-major) of t.
inline int64_t row_offset(const Tensor& t, int64_t row) {
  int64_t off = 0;
  for (int d = t.dim() - 2; d >= 0; --d) {
    off += (row % t.size(d)) * t.stride(d);
    row /= t.size(d);
  }
  return off;
}

// Element offset of flat (row-major logical) index i in a strided tensor.
inline int64_t elem_offset(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.size(d)) * t.stride(d);
    i /= t.size(d);
  }
  return off;
}

inline int64_t num_rows(const Tensor& t) { return t.dim() <= 1 ? 1 : t.numel() / t.size(-1); }

}  // namespace locus::cpu::detail
