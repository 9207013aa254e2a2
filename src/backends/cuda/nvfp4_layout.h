// Internal to the CUDA backend: the kCudaTiled NVFP4 weight layout that nvfp4_prepare writes and
// the weight-only GEMM kernel reads.
//
// The weight [N, K] is padded to N64 = ceil(N/64)*64 rows and K64 = ceil(K/64)*64 columns (zeros)
// and cut into tiles of 16 rows x 64 K ("row tile" rt, "chunk" c; C = K64/64 chunks per row).
// Tiles are stored group-major: the 4 row tiles of a 64-row group ("row group" G = rt/4) side by
// side for each chunk, so that a group's K range is one contiguous stretch of memory (what the
// streaming kernel reads; the NVFP4 kernels stream whole groups). Tile (rt, c) is 512 bytes at
// byte offset nvfp4_tile_index(rt, c, C)*512 = ((G*C + c)*4 + rt%4)*512, laid out in the order of
// the 32 lanes of the warp that reads it: lane l = 4g + t holds, in 16 bytes at +16*l,
//   word 0: row 16rt+g,   k = 64c+16t + 0..7      word 1: row 16rt+g,   k = 64c+16t + 8..15
//   word 2: row 16rt+g+8, k = 64c+16t + 0..7      word 3: row 16rt+g+8, k = 64c+16t + 8..15
// and inside a word the 8 values k0+j (j = 0..7) form 4 pairs p = j/2 (even j: the low bf16 of
// bf16x2 register p, odd j: the high one). Each value is its e2m1 code: magnitude bits b0..b2
// (m, e0, e1) and sign s. The kernel wants pair p as bf16x2 bits with b0..b2 at 6..8 and s at 15 (low
// value), b0..b2 at 22..24 and s at 31 (high value), i.e. under the mask 0x81C081C0. Pair p is
// stored rotated left by 3p (p < 3), so that it costs one rotate and one AND (none for p = 0).
// Pair 3 fills the remaining bits 0, 1, 3, 4 (+ 16): kept by an AND, times 2^2 + 2^7 + 2^12 they
// land on the mask with no carries (bit 0 -> 7, 1 -> 8, 3 -> 15, 4 -> 6, each + 16 for the high
// value; the other images fall outside the mask or past bit 31), so it costs an AND, an integer
// multiply and an AND (nvfp4_word_pair_bits below). No shifts or byte permutes of that mask tile
// a lane's four words (tools/nvfp4_word_search.py), so some pair needs more than a shift and an AND.
// Scales: one uint16 per (rt, c, lane) at element nvfp4_tile_index(rt, c, C)*32 + l: low byte for
// row 16rt+g, high byte for row 16rt+g+8, both for block (64c+16t)/16. Each e4m3 scale v > 0 is re-encoded
// as S = ((e + 9) << 3) | m with v = 2^e (1 + m/8) (e in [-9, 8], subnormal e4m3 normalized), so
// that the bf16 bits of v * 2^110 are S*16 + (228 << 7): one integer multiply-add in the kernel.
// A zero scale gets S = 0 and its 16 nibbles are zeroed. The prepared weight's `scales` tensor is
// one flat U8 buffer [N64*K64/16 + 16]: the scale array, then the fp32 global scale (16 bytes
// reserved). The kernel reads the global scale from there, so an in-place reload that copies
// `packed` and `scales` (or nvfp4_prepare_into) rewrites it too and captured graphs see it.
//
// In the kernel, nibble bits placed at bf16 bits 15, 8..6 give e2m1 * 2^-126 exactly; times the
// bf16 scale (v * 2^110) the product is exact (2 x 4 significant bits), so the accumulators hold
// sum * 2^-16, undone with the global scale in the epilogue.
#pragma once
#include <cstdint>

#include "core/float_convert.h"  // LOCUS_HD

namespace locus::cuda::detail {

constexpr int kNvfp4TileRows = 16;
constexpr int kNvfp4ChunkK = 64;
constexpr int kNvfp4TileBytes = 512;
constexpr int kNvfp4ScaleExpBias = 9;    // e + 9 >= 0 for every e4m3 value
constexpr uint32_t kNvfp4ScaleBf16Base = 228u << 7;  // 127 + 110 - 9 = 228
constexpr float kNvfp4AccUnscale = 65536.f;          // 2^(126 - 110)
constexpr int64_t kNvfp4GlobalScaleBytes = 16;       // reserved after the scale array

constexpr int kNvfp4GroupTiles = 4;  // row tiles per row group (stored side by side)

inline int64_t nvfp4_padded_rows(int64_t n) { return (n + 63) / 64 * 64; }
inline int64_t nvfp4_padded_k(int64_t k) { return (k + 63) / 64 * 64; }

// The position of tile (rt, c) in the group-major tile order (C chunks per row).
LOCUS_HD int64_t nvfp4_tile_index(int64_t rt, int64_t c, int64_t chunks) {
  return ((rt / kNvfp4GroupTiles) * chunks + c) * kNvfp4GroupTiles + rt % kNvfp4GroupTiles;
}

constexpr uint32_t kNvfp4PairMask = 0x81C081C0u;  // b0..b2 at 6..8 and s at 15, and the same + 16
constexpr int kNvfp4PairRotation = 3;            // pair p < 3 is stored rotated left by 3p
constexpr uint32_t kNvfp4LastPairBits = 0x001B001Bu;  // where pair 3 is stored
constexpr uint32_t kNvfp4LastPairSpread = (1u << 2) | (1u << 7) | (1u << 12);  // moves it onto the mask

LOCUS_HD uint32_t nvfp4_rotr(uint32_t w, int s) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(w, w, s);
#else
  return s == 0 ? w : (w >> s) | (w << (32 - s));
#endif
}

// Pair p of a layout word as bf16x2 bits (e2m1 * 2^-126 each, exact; see the top of this file).
LOCUS_HD uint32_t nvfp4_word_pair_bits(uint32_t w, int p) {
  if (p < 3) return nvfp4_rotr(w, kNvfp4PairRotation * p) & kNvfp4PairMask;
  return ((w & kNvfp4LastPairBits) * kNvfp4LastPairSpread) & kNvfp4PairMask;  // 32-bit product, no carries
}

// Where pair 3 stores the bit that nvfp4_word_pair_bits puts at mask bit `target`.
LOCUS_HD int nvfp4_last_pair_source(int target) {
  const int low = target % 16;  // 6, 7, 8 or 15
  const int source = low == 6 ? 4 : low == 7 ? 0 : low == 8 ? 1 : 3;
  return source + (target >= 16 ? 16 : 0);
}

// The K order of the dequantized registers within a 64-K chunk. Lane t of a tile holds K values
// 16t .. 16t + 15 of the chunk (above), as bf16 pairs: "physical" pair P = 8t + i holds K values
// 2P, 2P + 1, in register i of the lane's row (nvfp4_dequant_tile). An m16n8k16 / wgmma K step s
// takes registers 2s and 2s + 1 as its A fragment, i.e. the step's "logical" pairs t (K 2t, 2t + 1
// of the step) and t + 4 (K 2t + 8, 2t + 9). So physical pair P = 8t + 2s + h is logical pair
// 8s + 4h + t of the chunk, and the activations must be laid out in that logical order for a
// B operand read from memory (the wgmma kernel, nvfp4_wgmma.h).
LOCUS_HD int nvfp4_logical_pair(int physical) {
  const int t = physical >> 3, s = (physical & 7) >> 1, h = physical & 1;
  return 8 * s + 4 * h + t;
}

// The layout word holding the 8 e2m1 codes nib[0..7] (the inverse of nvfp4_word_pair_bits).
inline uint32_t nvfp4_pack_word(const uint8_t (&nib)[8]) {
  uint32_t w = 0;
  for (int j = 0; j < 8; ++j) {
    const int p = j / 2, h = j % 2;
    for (int b = 0; b < 4; ++b) {
      if (!((nib[j] >> b) & 1)) continue;
      const int target = (b < 3 ? 6 + b : 15) + 16 * h;
      w |= 1u << (p < 3 ? (target + kNvfp4PairRotation * p) % 32 : nvfp4_last_pair_source(target));
    }
  }
  return w;
}

}  // namespace locus::cuda::detail
