// The CUDA kernels' NVFP4 word layout (backends/cuda/nvfp4_layout.h), checked on the CPU: every
// pair of e2m1 codes packed into any of the four pair positions comes back as the bf16x2 bits of
// e2m1 * 2^-126, exactly, and the packing uses each of the 32 bits once; the K order in which the
// wgmma kernel lays out activations matches the registers of each K step.
#include "backends/cuda/nvfp4_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/float_convert.h"

namespace locus::cuda::detail {
namespace {

TEST(Nvfp4WordLayout, EveryPairOfCodesDecodesExactlyInEveryPosition) {
  for (int p = 0; p < 4; ++p) {
    for (int lo = 0; lo < 16; ++lo) {
      for (int hi = 0; hi < 16; ++hi) {
        uint8_t nib[8] = {};
        nib[2 * p] = static_cast<uint8_t>(lo);
        nib[2 * p + 1] = static_cast<uint8_t>(hi);
        const uint32_t w = nvfp4_pack_word(nib);
        const uint32_t bits = nvfp4_word_pair_bits(w, p);
        EXPECT_EQ(bf16_bits_to_f32(static_cast<uint16_t>(bits & 0xFFFF)),
                  std::ldexp(e2m1_to_f32(static_cast<uint8_t>(lo)), -126))
            << "pair " << p << " low code " << lo;
        EXPECT_EQ(bf16_bits_to_f32(static_cast<uint16_t>(bits >> 16)),
                  std::ldexp(e2m1_to_f32(static_cast<uint8_t>(hi)), -126))
            << "pair " << p << " high code " << hi;
        for (int q = 0; q < 4; ++q)  // the other pairs read zeros
          if (q != p) EXPECT_EQ(nvfp4_word_pair_bits(w, q), 0u) << "pair " << p << " leaks into pair " << q;
      }
    }
  }
}

// Full words: the other pairs' bits never reach a pair's bf16 bits (pair 3's multiply included).
TEST(Nvfp4WordLayout, FullWordsDecodeExactly) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> code(0, 15);
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t nib[8];
    for (auto& n : nib) n = static_cast<uint8_t>(code(rng));
    const uint32_t w = nvfp4_pack_word(nib);
    for (int p = 0; p < 4; ++p) {
      const uint32_t bits = nvfp4_word_pair_bits(w, p);
      for (int h = 0; h < 2; ++h)
        ASSERT_EQ(bf16_bits_to_f32(static_cast<uint16_t>(bits >> (16 * h))),
                  std::ldexp(e2m1_to_f32(nib[2 * p + h]), -126))
            << "word " << std::hex << w << std::dec << ", pair " << p << ", value " << h;
    }
  }
}

TEST(Nvfp4WordLayout, AllCodesSetFillTheWord) {
  uint8_t nib[8];
  for (auto& n : nib) n = 0xF;
  EXPECT_EQ(nvfp4_pack_word(nib), 0xFFFFFFFFu);
}

// Every K value of a chunk has one logical place, and each K step's A fragment (registers 2s and
// 2s + 1 of lane t's rows: physical pairs 8t + 2s and 8t + 2s + 1) meets the activations of the
// logical pairs t and t + 4 of step s, the K positions 2t.. and 2t + 8.. that m16n8k16 assigns them.
TEST(Nvfp4WordLayout, LogicalPairOrderMatchesEveryKStep) {
  bool seen[32] = {};
  for (int p = 0; p < 32; ++p) {
    const int l = nvfp4_logical_pair(p);
    ASSERT_GE(l, 0);
    ASSERT_LT(l, 32);
    EXPECT_FALSE(seen[l]) << "logical pair " << l << " twice";
    seen[l] = true;
  }
  for (int t = 0; t < 4; ++t) {
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(nvfp4_logical_pair(8 * t + 2 * s), 8 * s + t) << "lane t " << t << ", step " << s;
      EXPECT_EQ(nvfp4_logical_pair(8 * t + 2 * s + 1), 8 * s + 4 + t) << "lane t " << t << ", step " << s;
    }
  }
}

}  // namespace
}  // namespace locus::cuda::detail
