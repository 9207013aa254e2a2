#include "backends/cpu/pack.h"

#include <cmath>

#include "backends/cpu/elem_access.h"

namespace locus::cpu::detail {

std::vector<float> pack_rows_f32(const Tensor& x, ThreadPool& pool) {
  std::vector<float> out(static_cast<size_t>(x.numel()));
  if (x.numel() == 0) return out;
  const int64_t k = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = x.numel() / k;
  const DType dt = x.dtype();
  const void* base = x.data_ptr();
  pool.parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t off = x.dim() <= 1 ? 0 : row_offset(x, r);
      float* o = out.data() + r * k;
      if (dt == DType::kBF16) {
        const uint16_t* p = static_cast<const uint16_t*>(base) + off;
        for (int64_t c = 0; c < k; ++c) o[c] = bf16_bits_to_f32(p[c]);
      } else if (dt == DType::kFP32) {
        const float* p = static_cast<const float*>(base) + off;
        for (int64_t c = 0; c < k; ++c) o[c] = p[c];
      } else {
        for (int64_t c = 0; c < k; ++c) o[c] = load_f32(base, dt, off + c);
      }
    }
  });
  return out;
}

void OutRows::store(int64_t i, int64_t j, float v) const { store_at(i * ld + j, v); }

void OutRows::store_at(int64_t off, float v) const {
  if (dtype == DType::kBF16)
    reinterpret_cast<uint16_t*>(base)[off] = f32_to_bf16_bits(v);
  else
    store_f32(base, dtype, off, v);
}

float silu_mul(float g, float u) {
  const float s = g / (1.0f + std::exp(-g));
  return s * u;
}

}  // namespace locus::cpu::detail
