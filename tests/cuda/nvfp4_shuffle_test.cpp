// The host side of nvfp4_prepare (backends/cuda/nvfp4_shuffle.h), on the CPU: a random checkpoint
// weight with a row count and K that need padding and some zero scales is shuffled on one thread
// and on four; both give the same bytes, and every code, scale code and padding byte is read back
// from where the tile layout (nvfp4_layout.h) says it lies. A scale that is not a finite e4m3 value
// is an error naming its row and block. No GPU needed: runs wherever the CUDA backend is built.
#include "backends/cuda/nvfp4_shuffle.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "backends/cuda/nvfp4_layout.h"
#include "core/float_convert.h"

namespace locus::cuda::detail {
namespace {

constexpr int64_t kRows = 200, kK = 208;  // 4 row tiles of padding rows, one K chunk of 16 of 64

ops::Nvfp4Weight random_weight(uint64_t seed) {
  std::mt19937_64 rng(seed);
  ops::Nvfp4Weight w = ops::nvfp4_empty(kRows, kK, 0.37f);
  auto* q = w.packed.data<uint8_t>();
  for (int64_t i = 0; i < w.packed.numel(); ++i) q[i] = static_cast<uint8_t>(rng());
  auto* s = w.scales.data<uint8_t>();
  for (int64_t i = 0; i < w.scales.numel(); ++i)
    s[i] = rng() % 7 == 0 ? 0 : static_cast<uint8_t>(1 + rng() % 0x7E);  // zeros, subnormals, normals; no NaN
  return w;
}

// The e2m1 code of element (row, k) as the tiled bytes hold it.
uint8_t tiled_code(const Nvfp4HostTiled& h, int64_t row, int64_t k) {
  const int64_t C = h.k64 / kNvfp4ChunkK, rt = row / 16, c = k / 64;
  const int g = static_cast<int>(row % 8), half = static_cast<int>(row % 16 / 8), t = static_cast<int>(k % 64 / 16);
  const int word = static_cast<int>(k % 16 / 8), j = static_cast<int>(k % 8);
  const int64_t at = (nvfp4_tile_index(rt, c, C) * 32 + 4 * g + t) * 16 + 8 * half + 4 * word;
  uint32_t w = 0;
  std::memcpy(&w, &h.packed[static_cast<size_t>(at)], 4);
  const uint32_t x = nvfp4_word_pair_bits(w, j / 2) >> (16 * (j % 2));
  return static_cast<uint8_t>(((x >> 6) & 7) | (((x >> 15) & 1) << 3));
}

// The scale code of the block holding element (row, k).
uint8_t tiled_scale(const Nvfp4HostTiled& h, int64_t row, int64_t k) {
  const int64_t C = h.k64 / kNvfp4ChunkK;
  const int g = static_cast<int>(row % 8), half = static_cast<int>(row % 16 / 8), t = static_cast<int>(k % 64 / 16);
  return h.scales[static_cast<size_t>((nvfp4_tile_index(row / 16, k / 64, C) * 32 + 4 * g + t) * 2 + half)];
}

TEST(Nvfp4Shuffle, SameBytesOnAnyThreadsAndEveryValueWhereTheLayoutSays) {
  const ops::Nvfp4Weight w = random_weight(11);
  cpu::ThreadPool one(1), four(4);
  const Nvfp4HostTiled a = nvfp4_shuffle_host(w, one), b = nvfp4_shuffle_host(w, four);
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_EQ(a.scales, b.scales);
  ASSERT_EQ(a.n64, 256);
  ASSERT_EQ(a.k64, 256);
  const uint8_t* q = w.packed.data<uint8_t>();
  const uint8_t* s = w.scales.data<uint8_t>();
  for (int64_t row = 0; row < a.n64; ++row) {
    for (int64_t k = 0; k < a.k64; ++k) {
      const bool inside = row < kRows && k < kK;
      const uint8_t scale = inside ? s[row * (kK / 16) + k / 16] : 0;
      const uint8_t code = tiled_scale(a, row, k);
      if (scale == 0) {
        // Padding and zero-scale blocks: scale code 0 and the nibbles zeroed.
        ASSERT_EQ(code, 0) << "row " << row << " k " << k;
        ASSERT_EQ(tiled_code(a, row, k), 0) << "row " << row << " k " << k;
        continue;
      }
      const float v = std::ldexp(1.f + (code & 7) / 8.f, (code >> 3) - kNvfp4ScaleExpBias);
      ASSERT_EQ(v, e4m3_to_f32(scale)) << "row " << row << " k " << k;
      const uint8_t byte = q[row * (kK / 2) + k / 2];
      ASSERT_EQ(tiled_code(a, row, k), k % 2 == 0 ? (byte & 0xF) : (byte >> 4)) << "row " << row << " k " << k;
    }
  }
  float global = 0;
  std::memcpy(&global, &a.scales[static_cast<size_t>(a.n64 * a.k64 / 16)], sizeof(float));
  EXPECT_EQ(global, 0.37f);
}

TEST(Nvfp4Shuffle, ANonFiniteScaleNamesItsRowAndBlock) {
  ops::Nvfp4Weight w = random_weight(12);
  w.scales.data<uint8_t>()[137 * (kK / 16) + 5] = 0x7F;  // e4m3 NaN
  cpu::ThreadPool four(4);
  try {
    nvfp4_shuffle_host(w, four);
    FAIL() << "a NaN scale was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("row 137, block 5"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace locus::cuda::detail
