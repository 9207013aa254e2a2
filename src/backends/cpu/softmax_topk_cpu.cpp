// CPU row softmax and deterministic top-k.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/elem_access.h"

namespace locus::cpu {

void softmax(const Tensor& x, const Tensor& y, ThreadPool& pool) {
  const int64_t n = x.size(-1), rows = detail::num_rows(x);
  if (n == 0) return;
  pool.parallel_for(rows, std::max<int64_t>(1, 4096 / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = x.data<float>() + (x.dim() <= 1 ? 0 : detail::row_offset(x, r));
      float* out = y.data<float>() + (y.dim() <= 1 ? 0 : detail::row_offset(y, r));
      float mx = -INFINITY;
      for (int64_t c = 0; c < n; ++c) mx = std::max(mx, in[c]);
      float sum = 0.f;
      for (int64_t c = 0; c < n; ++c) {  // reads in[c] before writing out[c]: y may alias x
        const float e = std::exp(in[c] - mx);
        out[c] = e;
        sum += e;
      }
      for (int64_t c = 0; c < n; ++c) out[c] = out[c] / sum;
    }
  });
}

void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices, ThreadPool& pool) {
  const int64_t n = x.size(-1), rows = detail::num_rows(x);
  if (k == 0) return;
  pool.parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(n));
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t xo = x.dim() <= 1 ? 0 : detail::row_offset(x, r);
      for (int64_t c = 0; c < n; ++c) v[c] = detail::load_f32(x.data_ptr(), x.dtype(), xo + c);
      std::iota(order.begin(), order.end(), int64_t{0});
      // Larger first; equal values keep the lower index first; NaN after every number.
      auto before = [&](int64_t a, int64_t b) {
        const bool na = std::isnan(v[a]), nb = std::isnan(v[b]);
        if (na != nb) return nb;
        if (!na && v[a] != v[b]) return v[a] > v[b];
        return a < b;
      };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      const int64_t vo = values.dim() <= 1 ? 0 : detail::row_offset(values, r);
      const int64_t io = indices.dim() <= 1 ? 0 : detail::row_offset(indices, r);
      for (int64_t j = 0; j < k; ++j) {
        detail::store_f32(values.data_ptr(), values.dtype(), vo + j * values.stride(-1), v[order[j]]);
        const int64_t idx_off = io + j * indices.stride(-1);
        if (indices.dtype() == DType::kI32)
          indices.data<int32_t>()[idx_off] = static_cast<int32_t>(order[j]);
        else
          indices.data<int64_t>()[idx_off] = order[j];
      }
    }
  });
}

}  // namespace locus::cpu
