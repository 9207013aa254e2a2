// NVFP4 on the CPU: ModelOpt-exact quantization, dequantization, and the weight-only NVFP4 x
// BF16 GEMM (weights dequantized per panel into fp32, then the shared deterministic dot kernel).
#include <array>
#include <cmath>
#include <mutex>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/dot_driver.h"
#include "backends/cpu/elem_access.h"
#include "backends/cpu/pack.h"

namespace locus::cpu {
namespace {

constexpr int64_t kBlock = 16;  // elements per e4m3 scale

// ModelOpt's _cast_fp4: round to nearest even with saturation, the sign bit from (v < 0) so that
// -0.0 becomes code 0, and NaN (0/0 in an underflowed block) sorting past every bound (code 7).
uint8_t modelopt_e2m1(float v) {
  if (std::isnan(v)) return 7;
  if (v == 0.f) return 0;
  return f32_to_e2m1(v);
}

// byte -> (value of the low nibble, value of the high nibble)
const std::array<std::array<float, 2>, 256>& pair_table() {
  static const auto t = [] {
    std::array<std::array<float, 2>, 256> r{};
    for (int b = 0; b < 256; ++b) r[b] = {e2m1_to_f32(static_cast<uint8_t>(b & 0xF)), e2m1_to_f32(static_cast<uint8_t>(b >> 4))};
    return r;
  }();
  return t;
}

template <int RowsPerCol>
struct Nvfp4Rows {
  using Elem = float;
  static constexpr int kRowsPerCol = RowsPerCol;
  const ops::Nvfp4Weight* w;
  int64_t half;
  void rows(int64_t, int64_t j0, int64_t nj, const float** p, std::vector<float>& scratch) const {
    const int64_t k = w->k;
    scratch.resize(static_cast<size_t>(nj * RowsPerCol * k));
    nvfp4_dequantize_rows(*w, j0, nj, scratch.data());
    if (RowsPerCol == 2) nvfp4_dequantize_rows(*w, half + j0, nj, scratch.data() + nj * k);
    for (int64_t r = 0; r < nj * RowsPerCol; ++r) p[r] = scratch.data() + r * k;
  }
};

// Calls fn(r, off, k, sc) for each row r of `w` (element offset `off`, `k` elements `sc` apart),
// rows split over `pool`.
template <typename Fn>
void for_each_row(const Tensor& w, ThreadPool& pool, Fn&& fn) {
  const int64_t rows = detail::num_rows(w), k = w.dim() == 0 ? 1 : w.size(-1);
  const int64_t sc = w.dim() == 0 ? 0 : w.stride(-1);
  pool.parallel_for(rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(k, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fn(r, w.dim() <= 1 ? 0 : detail::row_offset(w, r), k, sc);
  });
}

}  // namespace

float nvfp4_global_scale_for(const Tensor& w, ThreadPool& pool) {
  std::mutex mu;
  float amax = 0.f;  // a max: the same whatever the split
  for_each_row(w, pool, [&](int64_t, int64_t off, int64_t k, int64_t sc) {
    float row_max = 0.f;
    for (int64_t c = 0; c < k; ++c)
      row_max = std::max(row_max, std::fabs(detail::load_f32(w.data_ptr(), w.dtype(), off + c * sc)));
    std::lock_guard<std::mutex> lock(mu);
    amax = std::max(amax, row_max);
  });
  if (amax == 0.f) return 1.f;
  return amax / (6.0f * 448.0f);
}

int64_t first_non_finite(const Tensor& w, ThreadPool& pool) {
  std::mutex mu;
  int64_t first = -1;  // the lowest such index, whatever the split
  for_each_row(w, pool, [&](int64_t r, int64_t off, int64_t k, int64_t sc) {
    for (int64_t c = 0; c < k; ++c) {
      if (std::isfinite(detail::load_f32(w.data_ptr(), w.dtype(), off + c * sc))) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (first < 0 || r * k + c < first) first = r * k + c;
      return;
    }
  });
  return first;
}

ops::Nvfp4Weight nvfp4_quantize(const Tensor& w, float global_scale, ThreadPool& pool) {
  const int64_t n = w.size(0), k = w.size(1);
  ops::Nvfp4Weight q = ops::nvfp4_empty(n, k, global_scale);
  uint8_t* packed = q.packed.data<uint8_t>();
  uint8_t* scales = q.scales.data<uint8_t>();
  const float six_g = 6.0f * global_scale;  // ModelOpt: per_block_amax / (6.0 * weight_scale_2)
  pool.parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
    float v[kBlock];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t off = w.stride(0) * r;
      for (int64_t b = 0; b < k / kBlock; ++b) {
        float amax = 0.f;
        for (int64_t e = 0; e < kBlock; ++e) {
          v[e] = detail::load_f32(w.data_ptr(), w.dtype(), off + (b * kBlock + e) * w.stride(1));
          amax = std::max(amax, std::fabs(v[e]));
        }
        float s = amax / six_g;
        if (s == 0.f) s = 1.f;
        const uint8_t code = f32_to_e4m3(s);
        scales[r * (k / kBlock) + b] = code;
        const float d = e4m3_to_f32(code) * global_scale;
        for (int64_t e = 0; e < kBlock; e += 2) {
          const uint8_t lo = modelopt_e2m1(v[e] / d), hi = modelopt_e2m1(v[e + 1] / d);
          packed[r * (k / 2) + (b * kBlock + e) / 2] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
    }
  });
  return q;
}

namespace {

// One row, scalar: the reference form of the dequantization.
void dequantize_row_scalar(const uint8_t* packed, const uint8_t* scales, int64_t k, float g, float* o) {
  const auto& lut = pair_table();
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float d = e4m3_to_f32(scales[b]) * g;  // ModelOpt: scale * weight_scale_2 first
    for (int64_t e = 0; e < kBlock / 2; ++e) {
      const auto& pair = lut[packed[b * (kBlock / 2) + e]];
      o[b * kBlock + 2 * e] = pair[0] * d;
      o[b * kBlock + 2 * e + 1] = pair[1] * d;
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same products, eight at a time: nibbles -> codes in element order, |e2m1| from an 8-entry
// permute, the sign bit xor-ed in (exact), then one multiply by the block's step d.
__attribute__((target("avx2"))) void dequantize_row_avx2(const uint8_t* packed, const uint8_t* scales, int64_t k,
                                                          float g, float* o) {
  const __m256 mags = _mm256_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m256i seven = _mm256_set1_epi32(7), eight = _mm256_set1_epi32(8);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const __m256 d = _mm256_set1_ps(e4m3_to_f32(scales[b]) * g);
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + b * (kBlock / 2)));
    const __m128i lo = _mm_and_si128(bytes, low4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
    const __m128i codes = _mm_unpacklo_epi8(lo, hi);  // element 2i from the low nibble of byte i
    for (int half = 0; half < 2; ++half) {
      const __m256i c = _mm256_cvtepu8_epi32(half ? _mm_srli_si128(codes, 8) : codes);
      const __m256 mag = _mm256_permutevar8x32_ps(mags, _mm256_and_si256(c, seven));
      const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, eight), 28);
      const __m256 v = _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
      _mm256_storeu_ps(o + b * kBlock + half * 8, _mm256_mul_ps(v, d));
    }
  }
}
bool have_avx2() {
  static const bool v = __builtin_cpu_supports("avx2");
  return v;
}
#endif

}  // namespace

void nvfp4_dequantize_rows(const ops::Nvfp4Weight& w, int64_t n0, int64_t rows, float* out) {
  const int64_t k = w.k;
  const uint8_t* packed = w.packed.data<uint8_t>();
  const uint8_t* scales = w.scales.data<uint8_t>();
  const int64_t lp = w.packed.stride(0), ls = w.scales.stride(0);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* pr = packed + (n0 + r) * lp;
    const uint8_t* sr = scales + (n0 + r) * ls;
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_avx2()) {
      dequantize_row_avx2(pr, sr, k, w.global_scale, out + r * k);
      continue;
    }
#endif
    dequantize_row_scalar(pr, sr, k, w.global_scale, out + r * k);
  }
}

Tensor nvfp4_dequantize(const ops::Nvfp4Weight& w, ThreadPool& pool) {
  Tensor out = Tensor::empty({w.n, w.k}, DType::kFP32);
  float* o = out.data<float>();
  pool.parallel_for(w.n, 1, [&](int64_t r0, int64_t r1) { nvfp4_dequantize_rows(w, r0, r1 - r0, o + r0 * w.k); });
  return out;
}

void nvfp4_gemm(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y, ThreadPool& pool) {
  const int64_t m = x.size(0), k = x.size(1), n = w.n;
  std::vector<float> xf = detail::pack_rows_f32(x, pool);
  std::vector<float> bf;
  if (bias.defined()) bf = detail::pack_rows_f32(bias, pool);
  const float* bp = bf.empty() ? nullptr : bf.data();
  const detail::OutRows out(y);
  detail::run_dot_panels(
      1, m, n, k, {xf.data(), k, 0}, Nvfp4Rows<1>{&w, 0},
      detail::bias_store_epilogue(out, bp), pool);
}

void nvfp4_gemm_swiglu(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& y, ThreadPool& pool) {
  const int64_t m = x.size(0), k = x.size(1), inter = w.n / 2;
  std::vector<float> xf = detail::pack_rows_f32(x, pool);
  const detail::OutRows out(y);
  detail::run_dot_panels(
      1, m, inter, k, {xf.data(), k, 0}, Nvfp4Rows<2>{&w, inter},
      detail::swiglu_store_epilogue(out), pool);
}

}  // namespace locus::cpu
