// The host side of nvfp4_prepare (nvfp4_shuffle.h): scale re-encoding and the tile shuffle.
#include "backends/cuda/nvfp4_shuffle.h"

#include <cmath>
#include <cstring>

#include "backends/cuda/nvfp4_layout.h"
#include "core/float_convert.h"

namespace locus::cuda::detail {
namespace {

// Re-encodes one e4m3 scale byte (nvfp4_layout.h); returns false for a zero scale.
bool encode_scale(uint8_t e4m3, uint8_t* code, int64_t row, int64_t block) {
  const float v = e4m3_to_f32(e4m3);
  LOCUS_CHECK(std::isfinite(v) && v >= 0.f, "nvfp4_prepare: block scale at row ", row, ", block ", block,
              " is not a finite non-negative e4m3 value (byte 0x", std::hex, static_cast<int>(e4m3), ")");
  if (v == 0.f) {
    *code = 0;
    return false;
  }
  int e = 0;
  const float frac = std::frexp(v, &e);  // v = frac * 2^e, frac in [0.5, 1)
  const int exp = e - 1;                  // v = 2^exp * (1 + m/8)
  const int m = static_cast<int>(std::lround((frac * 2.f - 1.f) * 8.f));
  LOCUS_CHECK(exp >= -kNvfp4ScaleExpBias && exp <= 8 && m >= 0 && m < 8 &&
                  std::ldexp(1.f + m / 8.f, exp) == v,
              "nvfp4_prepare: cannot re-encode block scale ", v);
  *code = static_cast<uint8_t>(((exp + kNvfp4ScaleExpBias) << 3) | m);
  return true;
}

}  // namespace

Nvfp4HostTiled nvfp4_shuffle_host(const ops::Nvfp4Weight& w, cpu::ThreadPool& pool) {
  LOCUS_CHECK(w.layout == ops::Nvfp4Layout::kLinear, "nvfp4_prepare: expected a kLinear (checkpoint) weight");
  LOCUS_CHECK(w.n > 0 && w.k > 0 && w.k % 16 == 0, "nvfp4_prepare: K must be a positive multiple of 16, got N=", w.n,
              " K=", w.k);
  Tensor packed = w.packed.device().is_cpu() ? w.packed : w.packed.to(Device::cpu());
  Tensor scales = w.scales.device().is_cpu() ? w.scales : w.scales.to(Device::cpu());
  LOCUS_CHECK((packed.dtype() == DType::kFP4E2M1x2 || packed.dtype() == DType::kU8) && packed.dim() == 2 &&
                  packed.size(0) == w.n && packed.size(1) == w.k / 2 && packed.stride(1) == 1,
              "nvfp4_prepare: packed must be fp4x2/u8 [", w.n, ", ", w.k / 2, "], got ", packed.describe());
  LOCUS_CHECK((scales.dtype() == DType::kFP8E4M3 || scales.dtype() == DType::kU8) && scales.dim() == 2 &&
                  scales.size(0) == w.n && scales.size(1) == w.k / 16 && scales.stride(1) == 1,
              "nvfp4_prepare: scales must be e4m3 [", w.n, ", ", w.k / 16, "], got ", scales.describe());
  LOCUS_CHECK(std::isfinite(w.global_scale), "nvfp4_prepare: global scale is not finite");
  Nvfp4HostTiled h;
  h.n64 = nvfp4_padded_rows(w.n);
  h.k64 = nvfp4_padded_k(w.k);
  const int64_t C = h.k64 / kNvfp4ChunkK;
  h.packed.assign(static_cast<size_t>(h.n64 * h.k64 / 2), 0);
  h.scales.assign(static_cast<size_t>(h.n64 * h.k64 / 16 + kNvfp4GlobalScaleBytes), 0);
  const uint8_t* q = packed.data<uint8_t>();
  const uint8_t* s = scales.data<uint8_t>();
  const int64_t qld = packed.stride(0), sld = scales.stride(0);
  // Row tiles write disjoint tiles, so they are split over the host's threads (a checkpoint's
  // NVFP4 weights all pass through here at load): the same bytes whatever the split.
  pool.parallel_for(h.n64 / 16, 4, [&](int64_t rt0, int64_t rt1) {
    for (int64_t rt = rt0; rt < rt1; ++rt) {
      for (int64_t c = 0; c < C; ++c) {
        const int64_t tile = nvfp4_tile_index(rt, c, C);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4;
          const int64_t kb = c * 64 + 16 * t;  // the lane's scale block
          uint8_t* out = &h.packed[static_cast<size_t>((tile * 32 + lane) * 16)];
          for (int half = 0; half < 2; ++half) {  // row g, row g + 8
            const int64_t row = rt * 16 + g + 8 * half;
            if (row >= w.n || kb >= w.k) continue;
            uint8_t code = 0;
            const bool nonzero = encode_scale(s[row * sld + kb / 16], &code, row, kb / 16);
            h.scales[static_cast<size_t>((tile * 32 + lane) * 2 + half)] = code;
            if (!nonzero) continue;
            uint32_t words[2];
            for (int word = 0; word < 2; ++word) {
              uint8_t nib[8];
              for (int j = 0; j < 8; ++j) {
                const int64_t k = kb + 8 * word + j;
                const uint8_t byte = q[row * qld + k / 2];
                nib[j] = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
              }
              words[word] = nvfp4_pack_word(nib);
            }
            std::memcpy(out + 8 * half, words, 8);
          }
        }
      }
    }
  });
  std::memcpy(&h.scales[static_cast<size_t>(h.n64 * h.k64 / 16)], &w.global_scale, sizeof(float));
  static_assert(kNvfp4GlobalScaleBytes >= sizeof(float));
  return h;
}

}  // namespace locus::cuda::detail
