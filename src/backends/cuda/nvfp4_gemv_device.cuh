// Internal to the CUDA backend (device code): what the NVFP4 decode matrix-vector kernels
// (nvfp4_gemv.h: one weight or a MoE's experts by id a launch, and the domain-aware form over a
// partitioned op's shards) share: one CTA block of a product (nvfp4_gemv_block) and the dispatch
// of the block shapes.
//
// A slot is TW row tiles (16 rows each; with SwiGLU a gate tile and its up tile) that one warp
// streams side by side, so that its activation loads serve them all. A CTA of 8 warps holds
// 8 / W slots; the W warps of a slot split its 64-K chunks into contiguous parts. Each lane
// loads, per chunk and tile, its 16 bytes of codes and its 2 scale bytes (the layout's A-fragment
// order, nvfp4_layout.h) straight into registers, U chunks a batch with the next batch in flight,
// and multiplies them with its token's 16 K values of the chunk (mma_fragments.cuh). The warps' C fragments are added in warp order in shared memory and the
// outputs written once: the same bits whichever kernel computes the block.
#pragma once
#include <cuda_bf16.h>

#include <type_traits>

#include "backends/cuda/bf16_gemv_device.cuh"  // gemv_load_streamed
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/stream_epilogue.cuh"  // silu

namespace locus::cuda::detail {

constexpr int kNvfp4GemvWarps = 8, kNvfp4GemvThreads = 32 * kNvfp4GemvWarps;

// A lane's two scale codes of a tile chunk: read once, so they bypass L1 like the codes.
__device__ __forceinline__ uint32_t nvfp4_gemv_load_scale(const uint16_t* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// One product a block belongs to: a weight times activation rows into output columns.
struct Nvfp4GemvProblem {
  const uint8_t* codes;
  const uint16_t* scales;
  const float* global_scale;  // nullptr: outputs of zero, nothing streamed (a by-id entry's id out of range)
  const uint16_t* x;
  int64_t x_ld;
  int m;
  int64_t n;         // output columns (SwiGLU: the weight has 2n rows, up rows from row n)
  int64_t y_offset;  // elements from Nvfp4GemvArgs::y to output row 0, column 0
  int64_t bias_col;  // the bias index of output column 0
};

// The shared memory of a block: each warp's C fragments.
template <int MB, int TW>
using Nvfp4GemvPartials = float4[kNvfp4GemvWarps][TW][MB][32];

// Block `block` (slots [block R, +R), R = 8 / W) of product `pr`: MB blocks of 8 tokens, TW tiles
// a slot, W warps a slot, SwiGLU (TW == 2: gate and up tile). LEAN (two blocks of tokens, one
// tile): each chunk's activations are loaded just before its products instead of a batch's all
// at once, which keeps a thread within the 80 registers of 3 CTAs an SM (see Nvfp4GemvShape::lean);
// the products are added in the same order, so the outputs have the same bits. `after_first` runs
// once the first batch of weights is asked for, before any activation is read (the one-weight
// kernel waits there for the previous kernel). Ends with the outputs written; callers that reuse
// `partial` need a barrier first.
template <int MB, int TW, int W, bool SWIGLU, bool LEAN, class Hook>
__device__ __forceinline__ void nvfp4_gemv_block(const Nvfp4GemvArgs& a, const Nvfp4GemvProblem& pr, int64_t block,
                                                 Nvfp4GemvPartials<MB, TW>& partial, Hook after_first) {
  static_assert(!SWIGLU || TW == 2, "SwiGLU pairs a gate tile with its up tile");
  static_assert(!LEAN || (MB == 2 && TW == 1), "the lean form is for two blocks of tokens and one tile");
  constexpr int R = kNvfp4GemvWarps / W;  // slots a CTA
  constexpr int U = TW * MB == 1 ? 4 : 2;  // chunks a batch: fewer where registers run short
  constexpr int kOutTiles = SWIGLU ? 1 : TW;
  // From chunk c of a tile to chunk c + 1 (group-major layout): 4 tiles of 512 code bytes, of 32
  // scale codes.
  constexpr int kCodeChunkStride = kNvfp4GroupTiles * kNvfp4TileBytes / 16;  // in uint4
  constexpr int kScaleChunkStride = kNvfp4GroupTiles * 32;                   // in uint16

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t out_tiles = (pr.n + 15) / 16;
  const int64_t slot = block * R + warp / W;
  const int chunks = static_cast<int>((a.k + 63) / 64);
  const int part = warp % W;
  const int c_begin = chunks * part / W;
  const int c_end = pr.global_scale != nullptr ? chunks * (part + 1) / W : c_begin;

  bool has[TW];
  const uint4* wp[TW];  // the lane's codes and scale codes of its next batch, tile j
  const uint16_t* sp[TW];
#pragma unroll
  for (int j = 0; j < TW; ++j) {
    const int64_t tile = SWIGLU ? slot + j * out_tiles : slot * TW + j;
    has[j] = (SWIGLU ? slot : tile) < out_tiles;
    const int64_t at = nvfp4_tile_index(has[j] ? tile : 0, c_begin, chunks) * 32 + lane;
    wp[j] = reinterpret_cast<const uint4*>(pr.codes) + at;
    sp[j] = pr.scales + at;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  struct Batch {  // a lane's codes and scale codes of U chunks of each tile
    uint4 w[TW][U];
    uint32_t s[TW][U];
  };
  // Loads chunks c .. c + U - 1 into `dst` (kFull: all are before c_end; else only those that
  // are) and moves the pointers past them.
  auto load_batch = [&](auto full, int c, Batch& dst) {
    constexpr bool kFull = decltype(full)::value;
#pragma unroll
    for (int j = 0; j < TW; ++j) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool ok = kFull || (has[j] && c + u < c_end);
        dst.w[j][u] = ok ? gemv_load_streamed(wp[j] + u * kCodeChunkStride) : zero;
        dst.s[j][u] = ok ? nvfp4_gemv_load_scale(sp[j] + u * kScaleChunkStride) : 0u;
      }
      wp[j] += U * kCodeChunkStride;
      sp[j] += U * kScaleChunkStride;
    }
  };

  Batch even, odd;  // batches alternate between them (no register copies)
  load_batch(std::false_type{}, c_begin, even);
  after_first();

  // Lane (g, t) multiplies token 8b + g's K values 64c + 16t .. + 15. Lanes of tokens past M read
  // token M - 1: their products land in output columns that are never stored.
  const uint16_t* x_lane[MB];
#pragma unroll
  for (int b = 0; b < MB; ++b) x_lane[b] = pr.x + min(8 * b + g, pr.m - 1) * pr.x_ld + 16 * t;
  // The lane's chunks with activations: K is a multiple of 16, so a lane's 16 values are all in
  // or all past it. Chunks before x_whole have all 64 (the same bound for every lane).
  const int x_end = min(c_end, static_cast<int>((a.k - 16 * t + 63) / 64));
  const int x_whole = static_cast<int>(a.k / 64);
  float acc[TW][MB][4];
#pragma unroll
  for (int j = 0; j < TW; ++j)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][b][r] = 0.f;

  // Batch c (in `cur`): its activations loaded, the next batch's weights asked for (into `next`),
  // then the products (LEAN: the next batch asked for first, then each chunk's activations just
  // before its products). kFull: both batches are whole and every activation exists (no
  // predicates).
  auto step = [&](auto full, int c, const Batch& cur, Batch& next) {
    constexpr bool kFull = decltype(full)::value;
    auto load_x = [&](int chunk, uint4 (&dst)[MB][2]) {
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        const bool ok = kFull || chunk < x_end;
        const uint4* xp = reinterpret_cast<const uint4*>(x_lane[b] + 64 * chunk);
        dst[b][0] = ok ? __ldg(xp) : zero;
        dst[b][1] = ok ? __ldg(xp + 1) : zero;
      }
    };
    if constexpr (LEAN) {
      load_batch(full, c + U, next);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        uint4 xv[MB][2];
        load_x(c + u, xv);
        nvfp4_chunk_mma<MB>(cur.w[0][u], cur.s[0][u], xv, acc[0]);
      }
    } else {
      uint4 xv[U][MB][2];
#pragma unroll
      for (int u = 0; u < U; ++u) load_x(c + u, xv[u]);
      load_batch(full, c + U, next);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < TW; ++j) nvfp4_chunk_mma<MB>(cur.w[j][u], cur.s[j][u], xv[u], acc[j]);
    }
  };
  // Whole steps while both batches' weights are before c_end and their activations whole; the
  // bounds are the warp's, so the whole warp takes the same branch (mma.sync needs all its lanes).
  int c = c_begin;
  const bool tiles_whole = SWIGLU ? has[0] : has[TW - 1];
  if (tiles_whole) {
    for (; c + 3 * U <= c_end && c + 2 * U <= x_whole; c += 2 * U) {
      step(std::true_type{}, c, even, odd);
      step(std::true_type{}, c + U, odd, even);
    }
  }
  for (; c < c_end; c += 2 * U) {
    step(std::false_type{}, c, even, odd);
    if (c + U < c_end) step(std::false_type{}, c + U, odd, even);
  }

#pragma unroll
  for (int j = 0; j < TW; ++j)
#pragma unroll
    for (int b = 0; b < MB; ++b) partial[warp][j][b][lane] = make_float4(acc[j][b][0], acc[j][b][1], acc[j][b][2], acc[j][b][3]);
  __syncthreads();

  // Each thread adds one lane's C fragment (a float4: rows g, g + 8 and tokens 2t, 2t + 1 of a
  // block of 8, lane 4g + t) over the slot's W warps in warp order, then writes those outputs.
  // Consecutive threads read consecutive float4s, free of bank conflicts (gathering one output a
  // thread from the fragments read them 8-way conflicted: at 16 tokens Nsight Compute counted 78 %
  // of the shared-memory wavefronts as excess).
  const float scale = pr.global_scale != nullptr ? *pr.global_scale * kNvfp4AccUnscale : 0.f;
  constexpr int kFragments = R * kOutTiles * MB * 32;
  for (int f = threadIdx.x; f < kFragments; f += kNvfp4GemvThreads) {
    const int fl = f % 32, b = (f / 32) % MB, j = (f / (32 * MB)) % kOutTiles, s = f / (32 * MB * kOutTiles);
    auto sum_of = [&](int tile) {
      float4 v = partial[s * W][tile][b][fl];
#pragma unroll
      for (int p = 1; p < W; ++p) {
        const float4 w = partial[s * W + p][tile][b][fl];
        v = make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w);
      }
      return make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
    };
    float4 out;
    if constexpr (SWIGLU) {
      const float4 gate = sum_of(0), up = sum_of(1);
      out = make_float4(silu(gate.x) * up.x, silu(gate.y) * up.y, silu(gate.z) * up.z, silu(gate.w) * up.w);
    } else {
      out = sum_of(j);
    }
    const int64_t col0 = ((block * R + s) * kOutTiles + j) * 16 + (fl >> 2);  // row g; + 8: row g + 8
    const int m0 = 8 * b + 2 * (fl & 3);                                       // token 2t; + 1: 2t + 1
    const float vals[4] = {out.x, out.y, out.z, out.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t col = col0 + 8 * (e >> 1);
      const int m = m0 + (e & 1);
      if (col >= pr.n || m >= pr.m) continue;
      float o = vals[e];
      if (!SWIGLU && a.bias != nullptr) {
        const int64_t bc = pr.bias_col + col;
        o += a.bias_f32 ? static_cast<const float*>(a.bias)[bc]
                        : __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[bc]);
      }
      const int64_t y_at = pr.y_offset + m * a.y_ld + col;
      if (a.y_f32) static_cast<float*>(a.y)[y_at] = o;
      else static_cast<__nv_bfloat16*>(a.y)[y_at] = __float2bfloat16_rn(o);
    }
  }
}

// Calls launch.template operator()<MB, TW, W, SWIGLU, LEAN>() for a block shape: mb blocks of 8
// tokens, tw tiles a warp (SwiGLU: 2), w warps a slot, the lean form (only with two blocks of
// tokens and one tile, not SwiGLU; nvfp4_gemv_lean_fits).
template <class Launch>
void dispatch_nvfp4_gemv_shape(int mb, int tw, int w, bool swiglu, bool lean, Launch&& launch) {
  auto with_w = [&]<int MB, int TW, bool SW, bool LEAN>() {
    switch (w) {
      case 1: launch.template operator()<MB, TW, 1, SW, LEAN>(); break;
      case 2: launch.template operator()<MB, TW, 2, SW, LEAN>(); break;
      case 4: launch.template operator()<MB, TW, 4, SW, LEAN>(); break;
      default: launch.template operator()<MB, TW, 8, SW, LEAN>(); break;
    }
  };
  auto with_tiles = [&]<int MB>() {
    if (swiglu) with_w.template operator()<MB, 2, true, false>();
    else if (tw == 2) with_w.template operator()<MB, 2, false, false>();
    else if constexpr (MB == 2) {
      if (lean) with_w.template operator()<MB, 1, false, true>();
      else with_w.template operator()<MB, 1, false, false>();
    } else {
      with_w.template operator()<MB, 1, false, false>();
    }
  };
  if (mb == 1) with_tiles.template operator()<1>();
  else with_tiles.template operator()<2>();
}

}  // namespace locus::cuda::detail
