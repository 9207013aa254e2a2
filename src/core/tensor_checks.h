// Validation helpers for op entry points. Each throws locus::Error with a message that names the
// op and the operand ("gemm: w must be bf16, got fp32[4, 8] on cpu:0").
#pragma once
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace locus::checks {

inline void defined(const char* op, const char* name, const Tensor& t) {
  LOCUS_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
}

inline void rank(const char* op, const char* name, const Tensor& t, int r) {
  defined(op, name, t);
  LOCUS_CHECK(t.dim() == r, op, ": ", name, " must have rank ", r, ", got ", t.describe());
}

inline std::string dtype_list(std::initializer_list<DType> allowed) {
  std::string s;
  for (DType d : allowed) s += (s.empty() ? "" : " or ") + std::string(dtype_name(d));
  return s;
}

inline void dtype(const char* op, const char* name, const Tensor& t, std::initializer_list<DType> allowed) {
  defined(op, name, t);
  for (DType d : allowed)
    if (t.dtype() == d) return;
  LOCUS_THROW(op, ": ", name, " must be ", dtype_list(allowed), ", got ", t.describe());
}

inline void same_device(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  LOCUS_CHECK(t.device() == ref.device(), op, ": ", name, " is on ", t.device().name(), " but ", ref_name, " is on ",
              ref.device().name());
}

inline void size(const char* op, const char* name, const Tensor& t, int d, int64_t want, const char* what) {
  LOCUS_CHECK(t.size(d) == want, op, ": ", name, " has ", what, "=", t.size(d), " but ", want, " is required (",
              name, " is ", t.describe(), ")");
}

// The last dimension is dense (unit stride); required by every kernel that reads rows.
inline void unit_last_stride(const char* op, const char* name, const Tensor& t) {
  LOCUS_CHECK(t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", name,
              " needs a unit stride in its last dimension, got strides ", shape_to_string(t.strides()), " for ",
              t.describe());
}

// [lo, hi) byte range a strided view can touch (empty tensors touch nothing).
inline void byte_range(const Tensor& t, const char*& lo, const char*& hi) {
  lo = hi = nullptr;
  if (!t.defined() || t.numel() == 0) return;
  int64_t min_off = 0, max_off = 0;
  for (int d = 0; d < t.dim(); ++d) {
    int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? min_off : max_off) += span;
  }
  const size_t es = dtype_size(t.dtype());
  const char* base = static_cast<const char*>(t.data_ptr());
  lo = base + min_off * static_cast<int64_t>(es);
  hi = base + (max_off + 1) * static_cast<int64_t>(es);
}

// Column slices of one row-major buffer (same dtype, same row stride, unit column stride) that
// do not wrap past the row stride: disjoint column intervals mean disjoint memory.
inline bool disjoint_column_slices(const Tensor& a, const Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || a.dtype() != b.dtype()) return false;
  const int64_t ld = a.stride(0);
  if (ld <= 0 || b.stride(0) != ld || a.stride(1) != 1 || b.stride(1) != 1) return false;
  const int64_t ca = a.offset() % ld, cb = b.offset() % ld;
  if (ca + a.size(1) > ld || cb + b.size(1) > ld) return false;
  return ca + a.size(1) <= cb || cb + b.size(1) <= ca;
}

// True when the memory two tensors can touch may overlap: exact for column slices of one
// row-major buffer, otherwise a comparison of the byte ranges they span (conservative).
inline bool may_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.storage() != b.storage()) return false;
  const char *alo, *ahi, *blo, *bhi;
  byte_range(a, alo, ahi);
  byte_range(b, blo, bhi);
  if (!alo || !blo) return false;
  if (!(alo < bhi && blo < ahi)) return false;
  return !disjoint_column_slices(a, b);
}

inline void no_overlap(const char* op, const char* out_name, const Tensor& out, const char* in_name, const Tensor& in) {
  LOCUS_CHECK(!may_overlap(out, in), op, ": output ", out_name, " overlaps input ", in_name,
              " (the op is not in place)");
}

}  // namespace locus::checks
