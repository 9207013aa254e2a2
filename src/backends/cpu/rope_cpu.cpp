// CPU rotary embedding: rotates pairs in place with the precomputed fp32 cos/sin table.
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/elem_access.h"

namespace locus::cpu {

void apply_rope(const Tensor& x, const Tensor& positions, const ops::RopeTable& table, bool interleaved,
                ThreadPool& pool) {
  const int64_t tokens = x.size(0), heads = x.dim() == 3 ? x.size(1) : 1, dim = x.size(-1), half = dim / 2;
  const int64_t st = x.stride(0), sh = x.dim() == 3 ? x.stride(1) : 0;
  const DType dt = x.dtype();
  void* base = x.data_ptr();
  const float* cos_t = table.cos.data<float>();
  const float* sin_t = table.sin.data<float>();
  const int64_t lc = table.cos.stride(0), ls = table.sin.stride(0);
  // Pair i of a head: elements (2i, 2i+1) interleaved, (i, i + dim/2) rotate-half.
  const int64_t step = interleaved ? 2 : 1, partner = interleaved ? 1 : half;
  pool.parallel_for(tokens * heads, std::max<int64_t>(1, 2048 / std::max<int64_t>(dim, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r / heads, h = r % heads;
      const int64_t pos = load_index(positions, t);
      const int64_t off = t * st + h * sh;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cos_t[pos * lc + i], s = sin_t[pos * ls + i];
        const int64_t o0 = off + i * step, o1 = o0 + partner;
        const float x0 = detail::load_f32(base, dt, o0), x1 = detail::load_f32(base, dt, o1);
        detail::store_f32(base, dt, o0, x0 * c - x1 * s);
        detail::store_f32(base, dt, o1, x0 * s + x1 * c);
      }
    }
  });
}

}  // namespace locus::cpu
