// Offsets of strided operands that share one logical shape: flat (row-major) index -> element
// offset in each operand. Size-1 dimensions are dropped and neighbours that every operand stores
// one inside the other are merged, so a contiguous tensor indexes with no division at all and
// the usual views with one or two.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace locus::cuda::detail {

inline constexpr int kMaxDims = 8;

template <int N>
struct OffsetCalc {
  int nd = 0;  // 0: one element at offset 0
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};

  __device__ __forceinline__ void offsets(int64_t flat, int64_t (&out)[N]) const {
#pragma unroll
    for (int o = 0; o < N; ++o) out[o] = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t i = flat % size[d];
      flat /= size[d];
#pragma unroll
      for (int o = 0; o < N; ++o) out[o] += i * stride[o][d];
    }
  }
};

// Offsets over the first `ndims` dimensions of `shape`, which every operand in `ops` has (an
// element-wise op passes all its dimensions, a row-wise op all but the last).
template <int N>
OffsetCalc<N> make_offset_calc(const char* op, const Shape& shape, int ndims, const std::array<const Tensor*, N>& ops) {
  std::vector<int64_t> sizes;                   // innermost first
  std::vector<std::array<int64_t, N>> strides;  // the innermost stride of each merged group
  for (int d = ndims - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    bool merge = !sizes.empty();
    for (int o = 0; o < N; ++o) {
      s[o] = ops[o]->stride(d);
      merge = merge && s[o] == strides.back()[o] * sizes.back();
    }
    if (merge) {
      sizes.back() *= shape[d];
    } else {
      sizes.push_back(shape[d]);
      strides.push_back(s);
    }
  }
  LOCUS_CHECK(sizes.size() <= static_cast<size_t>(kMaxDims), op, ": the CUDA kernel indexes at most ", kMaxDims,
              " dimensions that cannot be merged, got ", sizes.size(), " for ", ops[0]->describe());
  OffsetCalc<N> c;
  c.nd = static_cast<int>(sizes.size());
  for (int i = 0; i < c.nd; ++i) {
    const int d = c.nd - 1 - i;
    c.size[d] = sizes[i];
    for (int o = 0; o < N; ++o) c.stride[o][d] = strides[i][o];
  }
  return c;
}

// True when t's data pointer and every leading stride are multiples of 16 bytes, so that each
// row (last dimension) starts on a 16-byte boundary.
inline bool rows_aligned_16(const Tensor& t) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype()));
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int d = 0; d + 1 < t.dim(); ++d)
    if (t.size(d) > 1 && (t.stride(d) * es) % 16 != 0) return false;
  return true;
}

}  // namespace locus::cuda::detail
