// CPU RMSNorm, add, cast and embedding lookup. fp32 math, one rounding on store.
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/dot_kernel.h"
#include "backends/cpu/elem_access.h"

namespace locus::cpu {

int64_t load_index(const Tensor& ids, int64_t i) {
  const int64_t off = detail::elem_offset(ids, i);
  return ids.dtype() == DType::kI32 ? static_cast<int64_t>(ids.data<int32_t>()[off]) : ids.data<int64_t>()[off];
}

void rmsnorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, ThreadPool& pool) {
  const int64_t h = x.size(-1), rows = detail::num_rows(x);
  const DType xt = x.dtype(), yt = y.dtype(), wt = weight.dtype();
  std::vector<float> wf(static_cast<size_t>(h));
  for (int64_t c = 0; c < h; ++c) wf[c] = detail::load_f32(weight.data_ptr(), wt, c * weight.stride(0));
  pool.parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(h, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(h));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t xo = x.dim() <= 1 ? 0 : detail::row_offset(x, r);
      const int64_t yo = y.dim() <= 1 ? 0 : detail::row_offset(y, r);
      // Sum of squares in fixed lanes (k % 8) combined in a fixed tree, as the dot kernel does.
      float lanes[detail::kDotLanes] = {};
      for (int64_t c = 0; c < h; ++c) {
        v[c] = detail::load_f32(x.data_ptr(), xt, xo + c);
        lanes[c % detail::kDotLanes] += v[c] * v[c];
      }
      const float mean = detail::reduce_lanes(lanes) / static_cast<float>(h);
      const float inv = 1.0f / std::sqrt(mean + eps);
      for (int64_t c = 0; c < h; ++c) detail::store_f32(y.data_ptr(), yt, yo + c, v[c] * inv * wf[c]);
    }
  });
}

namespace {

// Row-wise loop shared by the element-wise ops: fn(offset_in_a, offset_in_b, offset_in_y) per element.
template <class Fn>
void for_each_element(const Tensor& y, const Tensor& a, const Tensor* b, ThreadPool& pool, Fn&& fn) {
  const int64_t cols = y.dim() == 0 ? 1 : y.size(-1), rows = detail::num_rows(y);
  if (y.numel() == 0) return;
  const int64_t sy = y.dim() ? y.stride(-1) : 0, sa = a.dim() ? a.stride(-1) : 0;
  const int64_t sb = b && b->dim() ? b->stride(-1) : 0;
  pool.parallel_for(rows, std::max<int64_t>(1, 16384 / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t yo = y.dim() <= 1 ? 0 : detail::row_offset(y, r);
      const int64_t ao = a.dim() <= 1 ? 0 : detail::row_offset(a, r);
      const int64_t bo = b && b->dim() > 1 ? detail::row_offset(*b, r) : 0;
      for (int64_t c = 0; c < cols; ++c) fn(ao + c * sa, bo + c * sb, yo + c * sy);
    }
  });
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& y, ThreadPool& pool) {
  const DType at = a.dtype(), bt = b.dtype(), yt = y.dtype();
  void* yp = y.data_ptr();
  const void *ap = a.data_ptr(), *bp = b.data_ptr();
  for_each_element(y, a, &b, pool, [&](int64_t ao, int64_t bo, int64_t yo) {
    detail::store_f32(yp, yt, yo, detail::load_f32(ap, at, ao) + detail::load_f32(bp, bt, bo));
  });
}

void cast(const Tensor& x, const Tensor& y, ThreadPool& pool) {
  const DType xt = x.dtype(), yt = y.dtype();
  void* yp = y.data_ptr();
  const void* xp = x.data_ptr();
  for_each_element(y, x, nullptr, pool, [&](int64_t xo, int64_t, int64_t yo) {
    detail::store_f32(yp, yt, yo, detail::load_f32(xp, xt, xo));
  });
}

void embedding(const Tensor& table, const Tensor& ids, const Tensor& y, ThreadPool& pool) {
  const int64_t t = ids.size(0), h = table.size(1);
  const DType tt = table.dtype(), yt = y.dtype();
  const size_t es = dtype_size(tt);
  pool.parallel_for(t, std::max<int64_t>(1, 8192 / std::max<int64_t>(h, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t id = load_index(ids, r);
      const int64_t src = id * table.stride(0), dst = r * y.stride(0);
      if (tt == yt) {
        std::memcpy(static_cast<char*>(y.data_ptr()) + dst * es, static_cast<const char*>(table.data_ptr()) + src * es,
                    static_cast<size_t>(h) * es);
      } else {
        for (int64_t c = 0; c < h; ++c)
          detail::store_f32(y.data_ptr(), yt, dst + c, detail::load_f32(table.data_ptr(), tt, src + c));
      }
    }
  });
}

}  // namespace locus::cpu
