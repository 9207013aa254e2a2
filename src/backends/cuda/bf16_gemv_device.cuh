// Internal to the CUDA backend (device code): what the BF16 decode matrix-vector kernels
// (bf16_gemv.h: one weight per launch, and the domain-aware form over partition shards) share:
// the streaming weight load, one CTA block of rows (gemv_block) and the output epilogue.
//
// A block is R slots of RW weight rows (1, or 2 from 2 tokens on): the 8 / R warps of a slot
// split its K into contiguous parts, each lane takes every 32nd 16-byte vector of its warp's part
// of each row. A lane keeps two batches of vectors in flight (the next batch is loaded before the
// current one is multiplied), accumulates in fp32 and the sums are combined in a fixed order:
// lane partials by a shuffle tree, then the slot's warps in index order. So a row's output has
// the same bits whichever kernel and block computes it, for the same R and RW.
#pragma once
#include <cstdint>

#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/mma_fragments.cuh"
#include "core/float_convert.h"

namespace locus::cuda::detail {

constexpr int kGemvWarps = 8, kGemvThreads = 32 * kGemvWarps;

// A weight vector: read once, so it bypasses L1 (the activations, reused by every row, stay there).
__device__ __forceinline__ uint4 gemv_load_streamed(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Writes token t's output in column `col`, the product's sum s: y = alpha s (+ bias[col]),
// rounded once to y's type.
__device__ __forceinline__ void gemv_store_output(const Bf16GemvArgs& a, int64_t t, int64_t col, float s) {
  if (a.alpha != nullptr) s *= *a.alpha;
  if (a.bias != nullptr)
    s += a.bias_f32 ? static_cast<const float*>(a.bias)[col]
                    : bf16_bits_to_f32(static_cast<const uint16_t*>(a.bias)[col]);
  if (a.y_f32)
    static_cast<float*>(a.y)[t * a.y_ld + col] = s;
  else
    static_cast<uint16_t*>(a.y)[t * a.y_ld + col] = f32_to_bf16_bits(s);
}

// The two bf16 values of a 32-bit word as fp32 (exact).
__device__ __forceinline__ float gemv_low_of(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float gemv_high_of(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// acc[t] += the dot product of weight vector wv with token t's vector xv[t] (8 terms in K order).
template <int M>
__device__ __forceinline__ void gemv_fma_vector(const uint4& wv, const uint4 (&xv)[M], float (&acc)[M]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t wi = uint4_word(wv, i);
#pragma unroll
    for (int t = 0; t < M; ++t) {
      acc[t] = fmaf(gemv_low_of(wi), gemv_low_of(uint4_word(xv[t], i)), acc[t]);
      acc[t] = fmaf(gemv_high_of(wi), gemv_high_of(uint4_word(xv[t], i)), acc[t]);
    }
  }
}

// The weight rows one block reads: `rows` rows of `w` (row stride w_ld elements) whose row r is
// output column col0 + r.
struct GemvRows {
  const uint16_t* w;
  int64_t w_ld, rows, col0;
};

// The sums of block `block` (rows [block R RW, +R RW) of `src`) into `partial`, one per
// (warp, row of its slot, token), then the outputs written by threads 0..R RW M - 1; ends with
// the CTA's barrier before those writes (callers that reuse `partial` need one more after).
// `before_multiply` runs after the first batch of weight loads is issued, before any activation
// is read (the one-weight kernel waits there for the previous kernel).
template <int M, int R, int RW, class Hook>
__device__ __forceinline__ void gemv_block(const Bf16GemvArgs& a, const GemvRows& src, int64_t block,
                                           float (&partial)[kGemvWarps][RW][M], Hook before_multiply) {
  constexpr int kWarpsPerSlot = kGemvWarps / R;
  constexpr int U = M * RW <= 2 ? 4 : 2;  // vectors a row per lane per batch: fewer where registers run short
  constexpr int kStep = 32 * U;           // vectors a warp's batch covers
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (block * R + warp / kWarpsPerSlot) * RW;
  const int part = warp % kWarpsPerSlot;
  const int64_t vectors = a.k / 8;
  const int64_t v_end = vectors * (part + 1) / kWarpsPerSlot;
  int64_t v = vectors * part / kWarpsPerSlot + lane;
  bool has_row[RW];
  const uint4* w_row[RW];
#pragma unroll
  for (int j = 0; j < RW; ++j) {
    has_row[j] = row0 + j < src.rows;
    w_row[j] = reinterpret_cast<const uint4*>(src.w + (has_row[j] ? row0 + j : 0) * src.w_ld);
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);

  uint4 wv[RW][U];
#pragma unroll
  for (int j = 0; j < RW; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u)
      wv[j][u] = has_row[j] && v + 32 * u < v_end ? gemv_load_streamed(w_row[j] + v + 32 * u) : zero;
  before_multiply();

  float acc[RW][U][M];
#pragma unroll
  for (int j = 0; j < RW; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < M; ++t) acc[j][u][t] = 0.f;
  for (; v < v_end; v += kStep) {
    uint4 xv[U][M];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const uint4* x_row = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + t * a.x_ld);
        xv[u][t] = v + 32 * u < v_end ? __ldg(x_row + v + 32 * u) : zero;
      }
    uint4 next[RW][U];
#pragma unroll
    for (int j = 0; j < RW; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t at = v + kStep + 32 * u;
        next[j][u] = has_row[j] && at < v_end ? gemv_load_streamed(w_row[j] + at) : zero;
      }
#pragma unroll
    for (int j = 0; j < RW; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) gemv_fma_vector<M>(wv[j][u], xv[u], acc[j][u]);
#pragma unroll
    for (int j = 0; j < RW; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) wv[j][u] = next[j][u];
  }

#pragma unroll
  for (int j = 0; j < RW; ++j)
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float s = acc[j][0][t];
#pragma unroll
      for (int u = 1; u < U; ++u) s += acc[j][u][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
      if (lane == 0) partial[warp][j][t] = s;
    }
  __syncthreads();
  if (threadIdx.x < R * RW * M) {
    const int slot = threadIdx.x / (RW * M), j = (threadIdx.x / M) % RW, t = threadIdx.x % M;
    const int64_t row = (block * R + slot) * RW + j;
    if (row < src.rows) {
      float s = partial[slot * kWarpsPerSlot][j][t];
#pragma unroll
      for (int p = 1; p < kWarpsPerSlot; ++p) s += partial[slot * kWarpsPerSlot + p][j][t];
      gemv_store_output(a, t, src.col0 + row, s);
    }
  }
}

// Calls launch.template operator()<M, R, RW>() for m tokens, rw rows a warp and `slots` row
// slots a CTA (bf16_gemv_slots_per_cta: 1, 2, 4 or 8): the instantiations both kernels compile.
template <class Launch>
void dispatch_gemv_shape(int64_t m, int rw, int slots, Launch&& launch) {
  auto with_slots = [&]<int M, int RW>() {
    switch (slots) {
      case 1: launch.template operator()<M, 1, RW>(); break;
      case 2: launch.template operator()<M, 2, RW>(); break;
      case 4: launch.template operator()<M, 4, RW>(); break;
      default: launch.template operator()<M, 8, RW>(); break;
    }
  };
  switch (m * 2 + (rw == 2 ? 1 : 0)) {
    case 2: with_slots.template operator()<1, 1>(); break;
    case 4: with_slots.template operator()<2, 1>(); break;
    case 5: with_slots.template operator()<2, 2>(); break;
    case 6: with_slots.template operator()<3, 1>(); break;
    case 7: with_slots.template operator()<3, 2>(); break;
    case 8: with_slots.template operator()<4, 1>(); break;
    default: with_slots.template operator()<4, 2>(); break;
  }
}

}  // namespace locus::cuda::detail
