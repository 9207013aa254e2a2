// Internal to the CUDA backend (device code): the mma.sync m16n8k16 bf16 step and the exact NVFP4
// dequantization into A fragments, shared by the weight kernels.
//
// Fragment convention (PTX ISA, mma.m16n8k16 .bf16): lane l = 4g + t holds
//   A: a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..), a3 = (row g+8, k 2t+8..)
//   B: b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g)
//   C: c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1).
// The weight kernels put 16 weight rows on the m side and 8 tokens on the n side. A sum over K does
// not care about the order of its terms, so each kernel permutes K the same way for weights and
// activations to let every lane load 16 contiguous bytes.
#pragma once
#include <cstdint>

#include "backends/cuda/nvfp4_layout.h"

namespace locus::cuda::detail {

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  const uint32_t neg_zero = 0x80008000u;  // fma(a, b, -0) == a * b exactly, signed zeros kept
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(neg_zero));
  return d;
}

// A re-encoded scale code (nvfp4_layout.h) as a bf16x2 pair of v * 2^110.
__device__ __forceinline__ uint32_t nvfp4_scale_pair(uint32_t code) {
  return code * 0x00100010u + (kNvfp4ScaleBf16Base | (kNvfp4ScaleBf16Base << 16));
}

// How a layout word's pairs become bf16x2 bits: the layout nvfp4_prepare writes (nvfp4_layout.h).
// (The kernels take it as a parameter so that a benchmark can time another encoding.)
struct Nvfp4WordBits {
  __device__ static uint32_t pair(uint32_t w, int p) { return nvfp4_word_pair_bits(w, p); }
};

// The 8 values of one layout word as four bf16x2 registers, times the block scale: exact.
template <typename Bits = Nvfp4WordBits>
__device__ __forceinline__ void nvfp4_dequant_word(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) r[p] = bf16x2_mul(Bits::pair(w, p), scale2);
}

__device__ __forceinline__ uint32_t uint4_word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// A lane's part of one 16 x 64 NVFP4 tile chunk (its 16 bytes `wv` and its two scale codes `sc`)
// as bf16 A-fragment registers, exact: lo[i] (row g) and hi[i] (row g + 8) hold K values
// 16t + 2i, + 1 of the lane's scale block (lane = 4g + t). K step s of an m16n8k16 (or wgmma
// m64nNk16) takes {lo[2s], hi[2s], lo[2s + 1], hi[2s + 1]}: its logical K pairs t and t + 4 are
// the physical pairs 8t + 2s and 8t + 2s + 1 of the chunk.
template <typename Bits = Nvfp4WordBits>
__device__ __forceinline__ void nvfp4_dequant_tile(const uint4& wv, uint32_t sc, uint32_t (&lo)[8], uint32_t (&hi)[8]) {
  const uint32_t s_lo = nvfp4_scale_pair(sc & 0xFFu), s_hi = nvfp4_scale_pair((sc >> 8) & 0xFFu);
#pragma unroll
  for (int w = 0; w < 4; ++w) {  // words 0, 1: row g; words 2, 3: row g + 8
    uint32_t r[4];
    nvfp4_dequant_word<Bits>(uint4_word(wv, w), w < 2 ? s_lo : s_hi, r);
#pragma unroll
    for (int p = 0; p < 4; ++p) (w < 2 ? lo : hi)[4 * (w & 1) + p] = r[p];
  }
}

// One 16 x 64 NVFP4 tile chunk times MB blocks of 8 tokens (each lane's activations xv[b][0..1]:
// its token's 16 K values of the chunk), accumulated in fp32 into acc (which then holds
// sum * 2^-16, see nvfp4_layout.h).
template <int MB, typename Bits = Nvfp4WordBits>
__device__ __forceinline__ void nvfp4_chunk_mma(const uint4& wv, uint32_t sc, const uint4 (&xv)[MB][2],
                                                float (&acc)[MB][4]) {
  uint32_t lo[8], hi[8];
  nvfp4_dequant_tile<Bits>(wv, sc, lo, hi);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const uint32_t b0 = uint4_word(xv[b][(2 * s) / 4], (2 * s) % 4);
      const uint32_t b1 = uint4_word(xv[b][(2 * s + 1) / 4], (2 * s + 1) % 4);
      mma_bf16_16816(acc[b], lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1], b0, b1);
    }
  }
}

}  // namespace locus::cuda::detail
