// Internal to the CUDA backend: the kCudaTiled NVFP4 weight layout that nvfp4_prepare writes and
// the weight-only GEMM kernel reads.
//
// The weight [N, K] is padded to N16 = ceil(N/16)*16 rows and K64 = ceil(K/64)*64 columns (zeros)
// and cut into tiles of 16 rows x 64 K ("row tile" rt, "chunk" c; C = K64/64 chunks per row).
// Tile (rt, c) is 512 bytes at byte offset (rt*C + c)*512, laid out in the order of the 32 lanes
// of the warp that reads it: lane l = 4g + t holds, in 16 bytes at +16*l,
//   word 0: row 16rt+g,   k = 64c+16t + 0..7      word 1: row 16rt+g,   k = 64c+16t + 8..15
//   word 2: row 16rt+g+8, k = 64c+16t + 0..7      word 3: row 16rt+g+8, k = 64c+16t + 8..15
// and inside a word the value k0+j (j = 0..7) sits at nibble 2p (bits 4p..4p+3, p = j/2) for even
// j, at bits 16+4p..16+4p+3 for odd j: one shift and mask gives a bf16x2 pair. Nibbles keep the
// e2m1 code (bit 3 = sign). Each lane's 16 K-values are exactly one 16-element scale block, and
// the MMA's K order is permuted consistently for weights and activations (a sum does not care).
//
// Scales: one uint16 per (rt, c, lane) at element (rt*C + c)*32 + l: low byte for row 16rt+g,
// high byte for row 16rt+g+8, both for block (64c+16t)/16. Each e4m3 scale v > 0 is re-encoded
// as S = ((e + 9) << 3) | m with v = 2^e (1 + m/8) (e in [-9, 8], subnormal e4m3 normalized), so
// that the bf16 bits of v * 2^110 are S*16 + (228 << 7): one integer multiply-add in the kernel.
// A zero scale gets S = 0 and its 16 nibbles are zeroed. The prepared weight's `scales` tensor is
// one flat U8 buffer [N16*K64/16 + 16]: the scale array, then the fp32 global scale (16 bytes
// reserved). The kernel reads the global scale from there, so an in-place reload that copies
// `packed` and `scales` (or nvfp4_prepare_into) rewrites it too and captured graphs see it.
//
// In the kernel, nibble bits placed at bf16 bits 15, 8..6 give e2m1 * 2^-126 exactly; times the
// bf16 scale (v * 2^110) the product is exact (2 x 4 significant bits), so the accumulators hold
// sum * 2^-16, undone with the global scale in the epilogue.
#pragma once
#include <cstdint>

namespace locus::cuda::detail {

constexpr int kNvfp4TileRows = 16;
constexpr int kNvfp4ChunkK = 64;
constexpr int kNvfp4TileBytes = 512;
constexpr int kNvfp4ScaleExpBias = 9;    // e + 9 >= 0 for every e4m3 value
constexpr uint32_t kNvfp4ScaleBf16Base = 228u << 7;  // 127 + 110 - 9 = 228
constexpr float kNvfp4AccUnscale = 65536.f;          // 2^(126 - 110)
constexpr int64_t kNvfp4GlobalScaleBytes = 16;       // reserved after the scale array

inline int64_t nvfp4_padded_rows(int64_t n) { return (n + 15) / 16 * 16; }
inline int64_t nvfp4_padded_k(int64_t k) { return (k + 63) / 64 * 64; }

}  // namespace locus::cuda::detail
