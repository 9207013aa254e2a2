// The weight-streaming skinny GEMM and its locality-domain form (stream_gemm.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/persistent_alloc.h"
#include "backends/cuda/stream_gemm.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda::detail {
namespace {

// Warps per CTA (W); each streams 1/W of the CTA's unit. NVFP4 with more than 8 tokens takes 8:
// it dequantizes in registers and needs the warps to hide its instruction latency (H200,
// docs/benchmarks.md: 5-10 % faster at M = 16 and 32 on the large shapes; at M = 1 four warps
// are as fast or faster). BF16 takes 4.
template <StreamWeight F, int MB>
constexpr int warps_per_cta() { return F == StreamWeight::kNVFP4 && MB > 1 ? 8 : 4; }
template <StreamWeight F, int MB>
constexpr int kThreads = warps_per_cta<F, MB>() * 32;  // per CTA

// Per-launch constants computed on the host.
struct Plan {
  int32_t chunks;   // K chunks per row group
  int32_t splits;   // S: units per row-group half
  int32_t units[kStreamGemmMaxDomains];  // queue length per domain
  unsigned* counters;  // [kStreamGemmMaxDomains unit counters][done][row-group counters...]
  float4* partials;    // [slot][tile of the group][MB][32 lanes]
  int32_t total_ctas;
  int32_t slot_bytes;  // one pipeline stage: the chunk's weights, then its activation rows
  int32_t ring_bytes;  // one warp's stages (also its share's sums after a unit)
};

constexpr int kDoneCounter = kStreamGemmMaxDomains;
constexpr int kTileCounters = kStreamGemmMaxDomains + 1;

// ---- cp.async: global -> shared without registers, so that many chunks are in flight per warp ----

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  // With a source size of 0 nothing is read and the 16 bytes are zero-filled.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}

// One work unit: chunks [c0, c0 + n) of one row group (kGroupTiles 16-row tiles) of one half
// (gate or up) of one batch entry of one part.
struct Unit {
  int32_t part, batch, group, half, s, c0, n, pad;
};

// A stage holds one chunk of a row group: its weights (kWeightBytes), then the activation rows
// that exist (m < M), kXRowBytes each, lane t's K quarter of row m at (m * 4 + t) * kXRowBytes / 4.
// Each lane reads back only what it copied itself, except the NVFP4 scale codes (a __syncwarp
// orders those). A chunk covers several tiles so that each activation load serves them all and
// the per-chunk bookkeeping is spread over more bytes.
template <StreamWeight F>
struct Format;

// NVFP4: 4 tiles x 64 K: per tile 512 bytes (16 per lane) and 64 bytes of scale codes (2 per
// lane); each lane's activations are its token's 16 K values of the chunk (one scale block).
template <>
struct Format<StreamWeight::kNVFP4> {
  static constexpr int kGroupTiles = 4;
  static constexpr int kChunkK = 64;
  static constexpr int kWeightBytes = kGroupTiles * (512 + 64);
  static constexpr int kXRowBytes = 128;
  struct Source {
    const uint8_t* w[kGroupTiles];  // the lane's 16 bytes of each tile in chunk 0 of the unit
    const uint8_t* s;               // lanes 0..15: 16 bytes of tile lane/4's chunk-0 scale codes
  };
  __device__ static Source source(const StreamGemmPart& p, int32_t chunks, const Unit& u, int lane) {
    Source src;
#pragma unroll
    for (int r = 0; r < kGroupTiles; ++r) {
      // Tiles past the part's end read its last tile (valid memory); their outputs are dropped.
      const int tile = min(u.group * kGroupTiles + r, p.tiles - 1);
      const int64_t at = (static_cast<int64_t>(tile) + u.half * p.up_offset) * chunks + u.c0;
      src.w[r] = static_cast<const uint8_t*>(p.w) + (at * 32 + lane) * 16;
    }
    const int tile = min(u.group * kGroupTiles + (lane >> 2), p.tiles - 1);
    const int64_t at = (static_cast<int64_t>(tile) + u.half * p.up_offset) * chunks + u.c0;
    src.s = reinterpret_cast<const uint8_t*>(p.scales) + at * 64 + (lane & 3) * 16;
    return src;
  }
  __device__ static void issue_weights(uint32_t slot, const Source& src, int j, int64_t, int lane) {
#pragma unroll
    for (int r = 0; r < kGroupTiles; ++r) cp_async16(slot + r * 512 + lane * 16, src.w[r] + static_cast<int64_t>(j) * 512, true);
    if (lane < 4 * kGroupTiles) cp_async16(slot + kGroupTiles * 512 + lane * 16, src.s + static_cast<int64_t>(j) * 64, true);
  }
  // The landed chunk in `slot` times the activation rows m < m_count, into acc.
  template <int MB>
  __device__ static void mma(uint32_t slot, int lane, int m_count, float (&acc)[kGroupTiles][MB][4]) {
    const int g = lane >> 2, t = lane & 3;
    uint4 xv[MB][2];  // the lane's token's 16 K values of the chunk, read once for all tiles
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int m = 8 * b + g;
      if (m < m_count) {
        const uint32_t at = slot + kWeightBytes + (m * 4 + t) * 32;
        xv[b][0] = lds128(at);
        xv[b][1] = lds128(at + 16);
      } else {
        xv[b][0] = xv[b][1] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int r = 0; r < kGroupTiles; ++r)
      nvfp4_chunk_mma<MB>(lds128(slot + r * 512 + lane * 16), lds16(slot + kGroupTiles * 512 + r * 64 + lane * 2), xv,
                          acc[r]);
  }
  // Lane t of row m copies K [64c + 16t, +16) of its token: two 16-byte pieces.
  __device__ static void issue_x(uint32_t xslot, const uint16_t* xrow, int64_t k0, int64_t k, int m, int t) {
    const int64_t kb = k0 + 16 * t;
    const bool valid = kb < k;
    const uint16_t* src = valid ? xrow + kb : xrow;
    cp_async16(xslot + (m * 4 + t) * 32, src, valid);
    cp_async16(xslot + (m * 4 + t) * 32 + 16, valid ? src + 8 : src, valid);
  }
  __device__ static float out_scale(const StreamGemmPart& p) { return *p.global_scale * kNvfp4AccUnscale; }
};

// BF16: one tile x 256 K of the row-major weight: lane t's pieces are 8 K values (16 bytes) at
// k0 + 8t + 32q, q < kPieces, of row g and of row g + 8, so that the 4 lanes of a row cover its
// 512 contiguous bytes (long DRAM bursts); the token's activations at the same K.
template <>
struct Format<StreamWeight::kBF16> {
  static constexpr int kGroupTiles = 1;
  static constexpr int kPieces = 8;
  static constexpr int kChunkK = 32 * kPieces;
  static constexpr int kWeightBytes = kGroupTiles * 2 * kPieces * 512;
  static constexpr int kXRowBytes = 2 * kChunkK;
  struct Source {
    const uint16_t* row[kGroupTiles][2];  // rows g and g + 8 of each tile, at the lane's K of chunk 0
    int64_t k0;
  };
  __device__ static Source source(const StreamGemmPart& p, int32_t, const Unit& u, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int64_t k0 = static_cast<int64_t>(u.c0) * kChunkK + 8 * t;
    const auto* w = static_cast<const uint16_t*>(p.w) + u.batch * p.w_batch_stride;
    Source src;
#pragma unroll
    for (int r = 0; r < kGroupTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Rows past the part's end read its last row (valid memory); their outputs are dropped.
        const int64_t row = min((u.group * kGroupTiles + r) * 16 + g + 8 * h, p.rows - 1) + u.half * p.up_offset;
        src.row[r][h] = w + row * p.ldw + k0;
      }
    src.k0 = k0;
    return src;
  }
  // Stage layout: piece q of row half h of tile r at ((r * 2 + h) * kPieces + q) * 512 + lane * 16.
  __device__ static void issue_weights(uint32_t slot, const Source& src, int j, int64_t k, int lane) {
#pragma unroll
    for (int q = 0; q < kPieces; ++q) {
      const int64_t off = static_cast<int64_t>(j) * kChunkK + 32 * q;
      const bool valid = src.k0 + off < k;
#pragma unroll
      for (int r = 0; r < kGroupTiles; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          cp_async16(slot + ((r * 2 + h) * kPieces + q) * 512 + lane * 16, valid ? src.row[r][h] + off : src.row[r][h],
                     valid);
    }
  }
  // The landed chunk in `slot` times the activation rows m < m_count, into acc (activations read
  // piece by piece: all 8 pieces at once would take 32 registers per 8 tokens).
  template <int MB>
  __device__ static void mma(uint32_t slot, int lane, int m_count, float (&acc)[kGroupTiles][MB][4]) {
    const int g = lane >> 2, t = lane & 3;
    const uint32_t xslot = slot + kWeightBytes;
#pragma unroll
    for (int q = 0; q < kPieces; ++q) {
      uint4 xq[MB];
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        const int m = 8 * b + g;
        xq[b] = m < m_count ? lds128(xslot + (m * 4 + t) * (kPieces * 16) + q * 16) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int r = 0; r < kGroupTiles; ++r) {
        const uint4 lo = lds128(slot + ((r * 2) * kPieces + q) * 512 + lane * 16);
        const uint4 hi = lds128(slot + ((r * 2 + 1) * kPieces + q) * 512 + lane * 16);
        bf16_chunk_mma<MB>(lo, hi, xq, acc[r]);
      }
    }
  }
  // Lane t of row m copies K [64c + 8t + 32q, +8) of its token for every piece q.
  __device__ static void issue_x(uint32_t xslot, const uint16_t* xrow, int64_t k0, int64_t k, int m, int t) {
#pragma unroll
    for (int q = 0; q < kPieces; ++q) {
      const int64_t kb = k0 + 32 * q + 8 * t;
      const bool valid = kb < k;
      cp_async16(xslot + (m * 4 + t) * (kPieces * 16) + 16 * q, valid ? xrow + kb : xrow, valid);
    }
  }
  __device__ static float out_scale(const StreamGemmPart&) { return 1.f; }
};

// Pipeline stages per warp: about 8 KB of weights in flight per warp (enough, with a few warps
// per SM, to cover the memory latency) within a shared-memory budget that fits several CTAs.
template <StreamWeight F, int MB>
constexpr int pipeline_stages() {
  if constexpr (F == StreamWeight::kNVFP4) return MB == 1 ? 6 : MB == 2 ? 5 : 4;
  else return MB == 4 ? 2 : 3;
}
// Unit descriptors between the producer (ahead) and the consumer: at most one per stage, + 1.

__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

// Writes the outputs of one finished tile: v[h] holds the tile's (gate, up) sums in C-fragment order.
template <StreamWeight F, int MB, int H>
__device__ __forceinline__ void store_tile(const StreamGemmArgs& a, const StreamGemmPart& p, int batch, int tile,
                                           int lane, const float (&v)[H][MB][4]) {
  const int g = lane >> 2, t = lane & 3;
  const float scale = Format<F>::out_scale(p);
#pragma unroll
  for (int b = 0; b < MB; ++b) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int n = tile * 16 + g + 8 * (r >> 1);
      const int m = 8 * b + 2 * t + (r & 1);
      if (n >= p.rows || m >= a.m) continue;
      float out = v[0][b][r] * scale;
      if constexpr (H == 2) {
        out = silu(out) * (v[1][b][r] * scale);
      } else if (p.bias) {
        out += a.bias_f32 ? static_cast<const float*>(p.bias)[n]
                          : __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[n]);
      }
      const int64_t at = static_cast<int64_t>(m) * a.y_ld + p.y_offset + batch * p.y_batch_stride + n;
      if (a.y_f32) static_cast<float*>(a.y)[at] = out;
      else static_cast<__nv_bfloat16*>(a.y)[at] = __float2bfloat16_rn(out);
    }
  }
}

// The part, batch entry, row group, half and K range of unit `unit` of `domain`'s queue.
template <int H>
__device__ __forceinline__ Unit decode_unit(const StreamGemmArgs& a, const Plan& pl, int domain, int unit) {
  Unit u{};
  for (int q = 0; q < a.num_parts; ++q) {
    const StreamGemmPart& cand = a.parts[q];
    if (cand.domain == domain && unit >= cand.unit_begin && unit < cand.unit_begin + cand.batch * cand.groups * H * pl.splits) {
      u.part = q;
      break;
    }
  }
  const StreamGemmPart& p = a.parts[u.part];
  // Units are split-major: consecutive units share a K range (and so the activations in L2).
  const int local = unit - p.unit_begin;
  const int group_halves = p.batch * p.groups * H;
  u.s = local / group_halves;
  const int batch_group = (local % group_halves) / H;
  u.batch = batch_group / p.groups;
  u.group = batch_group % p.groups;
  u.half = local % H;
  u.c0 = static_cast<int>(static_cast<int64_t>(pl.chunks) * u.s / pl.splits);
  u.n = static_cast<int>(static_cast<int64_t>(pl.chunks) * (u.s + 1) / pl.splits) - u.c0;
  return u;
}

// Streams chunks [c0, c1) of unit u through this warp's cp.async ring (STAGES - 1 chunks ahead)
// into acc.
template <StreamWeight F, int MB>
__device__ __forceinline__ void warp_stream(const StreamGemmArgs& a, const Plan& pl, const Unit& u, int c0, int c1,
                                            uint32_t ring, int lane, float (&acc)[Format<F>::kGroupTiles][MB][4]) {
  using Fmt = Format<F>;
  constexpr int kStages = pipeline_stages<F, MB>();
  const int g = lane >> 2, t = lane & 3;
  const StreamGemmPart& p = a.parts[u.part];
  Unit from = u;
  from.c0 = c0;
  const typename Fmt::Source src = Fmt::source(p, pl.chunks, from, lane);
  const uint16_t* x = (p.x ? p.x : a.x) + u.batch * p.x_batch_stride;
  const int n = c1 - c0;
  auto issue = [&](int j) {  // chunk j of the range into stage j % kStages; always one commit group
    if (j < n) {
      const uint32_t slot = ring + (j % kStages) * pl.slot_bytes;
      Fmt::issue_weights(slot, src, j, a.k, lane);
      const int64_t k0 = static_cast<int64_t>(c0 + j) * Fmt::kChunkK;
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        const int m = 8 * b + g;
        if (m < a.m) Fmt::issue_x(slot + Fmt::kWeightBytes, x + m * a.x_ld, k0, a.k, m, t);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) issue(j);
  for (int j = 0; j < n; ++j) {
    __syncwarp();  // every lane has read the stage that is refilled next
    issue(j + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();  // stages written by other lanes (NVFP4 scale codes) are visible
    const uint32_t slot = ring + (j % kStages) * pl.slot_bytes;
    Fmt::template mma<MB>(slot, lane, a.m, acc);
  }
  cp_async_wait<0>();
  __syncwarp();
}

// Each CTA takes one unit at a time (a row group's K range, own domain first), its warps split
// the range W ways and stream their shares, the shares are added in shared memory in warp
// order, and warp r writes tile r of the group: directly when the group is one unit, else as a
// partial that the group's last unit adds in unit order (deterministic either way).
template <StreamWeight F, int MB, int H>
__global__ void __launch_bounds__(kThreads<F, MB>)
    stream_gemm_kernel(const __grid_constant__ StreamGemmArgs a, const __grid_constant__ Plan pl) {
  using Fmt = Format<F>;
  constexpr int W = warps_per_cta<F, MB>();
  constexpr int kStages = pipeline_stages<F, MB>();
  constexpr int R = Fmt::kGroupTiles;
  static_assert(R <= W, "one warp per tile in the reduction");
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_domain, s_unit;
  __shared__ unsigned s_arrived;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + warp * pl.ring_bytes;
  // After a unit's pipelines drain, each warp's ring holds its share's sums for the reduction.
  auto share = [&](int w, int r, int b) {
    return reinterpret_cast<float4*>(smem + w * pl.ring_bytes) + (r * MB + b) * 32;
  };

  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  int home = 0;
  if (a.sm_domain != nullptr) {
    const uint8_t d = smid < 1024 ? a.sm_domain[smid] : kNoDomain;
    home = d < a.num_domains ? d : static_cast<int>(smid % a.num_domains);
  }
  unsigned exhausted = 0;  // (thread 0's)
  const int units_per_group = H * pl.splits;
  while (true) {
    if (threadIdx.x == 0) {
      s_domain = -1;
      for (int i = 0; i < a.num_domains; ++i) {
        int d = home + i;
        if (d >= a.num_domains) d -= a.num_domains;
        if ((exhausted >> d) & 1u) continue;
        const unsigned u = atomicAdd(pl.counters + d, 1u);
        if (u < static_cast<unsigned>(pl.units[d])) {
          s_domain = d;
          s_unit = static_cast<int>(u);
          break;
        }
        exhausted |= 1u << d;
      }
    }
    __syncthreads();
    if (s_domain < 0) break;
    const Unit u = decode_unit<H>(a, pl, s_domain, s_unit);
    const StreamGemmPart& p = a.parts[u.part];

    float acc[R][MB][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][b][e] = 0.f;
    const int wc0 = u.c0 + u.n * warp / W, wc1 = u.c0 + u.n * (warp + 1) / W;
    if (wc1 > wc0) warp_stream<F, MB>(a, pl, u, wc0, wc1, ring, lane, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < MB; ++b) *(share(warp, r, b) + lane) = make_float4(acc[r][b][0], acc[r][b][1], acc[r][b][2], acc[r][b][3]);
    __syncthreads();

    // Warp r owns tile r of the group: the unit's sum over the W shares, in warp order.
    float v[MB][4];
    if (warp < R) {
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        float4 sum = *(share(0, warp, b) + lane);
#pragma unroll
        for (int w = 1; w < W; ++w) {
          const float4 q = *(share(w, warp, b) + lane);
          sum.x += q.x;
          sum.y += q.y;
          sum.z += q.z;
          sum.w += q.w;
        }
        v[b][0] = sum.x;
        v[b][1] = sum.y;
        v[b][2] = sum.z;
        v[b][3] = sum.w;
      }
    }
    const int tile = u.group * R + warp;
    if (units_per_group == 1) {
      if (warp < R) {
        const float(&vv)[1][MB][4] = reinterpret_cast<const float(&)[1][MB][4]>(v);
        store_tile<F, MB, 1>(a, p, u.batch, tile, lane, vv);
      }
      __syncthreads();  // the rings are refilled by the next unit
      continue;
    }
    const int batch_group = u.batch * p.groups + u.group;
    const int64_t group_slot0 = p.partial_base + static_cast<int64_t>(batch_group) * units_per_group;
    if (warp < R) {
      float4* mine = pl.partials + ((group_slot0 + u.half * pl.splits + u.s) * R + warp) * MB * 32;
#pragma unroll
      for (int b = 0; b < MB; ++b) __stcg(mine + b * 32 + lane, make_float4(v[b][0], v[b][1], v[b][2], v[b][3]));
      __threadfence();
    }
    __syncthreads();
    unsigned* counter = pl.counters + kTileCounters + p.tile_base + batch_group;
    if (threadIdx.x == 0) s_arrived = atomicAdd(counter, 1u);
    __syncthreads();
    if (s_arrived == static_cast<unsigned>(units_per_group - 1) && warp < R) {
      __threadfence();
      float sum[H][MB][4];
#pragma unroll
      for (int h = 0; h < H; ++h) {
#pragma unroll
        for (int b = 0; b < MB; ++b)
#pragma unroll
          for (int e = 0; e < 4; ++e) sum[h][b][e] = 0.f;
        for (int s2 = 0; s2 < pl.splits; ++s2) {
          const float4* src = pl.partials + ((group_slot0 + h * pl.splits + s2) * R + warp) * MB * 32;
#pragma unroll
          for (int b = 0; b < MB; ++b) {
            const float4 f = __ldcg(src + b * 32 + lane);
            sum[h][b][0] += f.x;
            sum[h][b][1] += f.y;
            sum[h][b][2] += f.z;
            sum[h][b][3] += f.w;
          }
        }
      }
      store_tile<F, MB, H>(a, p, u.batch, tile, lane, sum);
      if (warp == 0 && lane == 0) *counter = 0;  // ready for the next launch (graph replays too)
    }
    __syncthreads();
  }
  // The last CTA out resets the unit counters for the next launch.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(pl.counters + kDoneCounter, 1u) == static_cast<unsigned>(pl.total_ctas - 1)) {
      for (int d = 0; d < kStreamGemmMaxDomains; ++d) pl.counters[d] = 0;
      pl.counters[kDoneCounter] = 0;
      __threadfence();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// host side

// Per-(device, stream) counters and partial tiles, grown on demand (persistent_alloc.h: an
// outgrown buffer is kept alive, since a captured graph may still use it).
struct Scratch {
  unsigned* counters = nullptr;
  size_t counter_cap = 0;
  float4* partials = nullptr;
  size_t partial_cap = 0;
};

Scratch scratch_for(cudaStream_t stream, size_t counters, size_t partials) {
  static std::mutex mu;
  static auto* all = new std::map<std::pair<int, cudaStream_t>, Scratch>();
  std::lock_guard<std::mutex> lock(mu);
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  Scratch& s = (*all)[{dev, stream}];
  if (s.partial_cap < partials) {
    const size_t cap = std::max(partials, 2 * s.partial_cap);
    // Partials are written before they are read; they need no initialization (zeroed anyway).
    s.partials = static_cast<float4*>(persistent_device_alloc(cap * sizeof(float4), nullptr, "allocating the streaming GEMM partials"));
    s.partial_cap = cap;
  }
  if (s.counter_cap < counters) {
    const size_t cap = std::max(counters, 2 * s.counter_cap);
    s.counters = static_cast<unsigned*>(persistent_device_alloc(cap * sizeof(unsigned), nullptr, "allocating the streaming GEMM counters"));
    s.counter_cap = cap;
  }
  return s;
}

int sm_count_for(cudaStream_t stream) {
  const int part = partition_stream_sm_count(stream);
  if (part > 0) return part;
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  return sms;
}

std::atomic<int> g_units_per_sm{0};

// Resident CTAs per SM of one kernel instantiation at a dynamic shared-memory size (cached).
template <StreamWeight F, int MB, int H>
int blocks_per_sm(int smem_bytes) {
  static std::mutex mu;
  static std::map<int, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(smem_bytes);
  if (it != cache.end()) return it->second;
  auto* kernel = stream_gemm_kernel<F, MB, H>;
  if (cache.empty()) {
    int dev = 0, optin = 0;
    LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
    LOCUS_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaFuncAttributes attr{};
    LOCUS_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));  // its static shared memory counts too
    LOCUS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          optin - static_cast<int>(attr.sharedSizeBytes)));
  }
  int n = 0;
  LOCUS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads<F, MB>, smem_bytes));
  LOCUS_CHECK(n >= 1, "streaming GEMM: ", smem_bytes, " bytes of shared memory per CTA do not fit an SM");
  cache[smem_bytes] = n;
  return n;
}

template <StreamWeight F, int MB, int H>
void launch_typed(StreamGemmArgs& a, cudaStream_t stream) {
  // A stage holds the chunk's weights and the activation rows that exist (16-byte multiples).
  const int slot_bytes = Format<F>::kWeightBytes + a.m * Format<F>::kXRowBytes;
  // (A warp's ring also holds its share's sums after the unit: R * MB * 32 float4.)
  const int ring_bytes = std::max(pipeline_stages<F, MB>() * slot_bytes, Format<F>::kGroupTiles * MB * 512);
  constexpr int W = warps_per_cta<F, MB>();
  const int smem_bytes = W * ring_bytes;
  const int max_blocks = blocks_per_sm<F, MB, H>(smem_bytes) * sm_count_for(stream);
  const int32_t chunks = static_cast<int32_t>((a.k + Format<F>::kChunkK - 1) / Format<F>::kChunkK);

  constexpr int R = Format<F>::kGroupTiles;
  int64_t group_halves = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    a.parts[i].tiles = (a.parts[i].rows + 15) / 16;
    a.parts[i].groups = (a.parts[i].tiles + R - 1) / R;
    group_halves += static_cast<int64_t>(a.parts[i].batch) * a.parts[i].groups * H;
  }
  // S: about `ups` units per SM. Splitting K across CTAs costs a chain of memory round trips
  // (partials, fence, counter, the last unit's reads), so S stays 1 whenever the row groups
  // alone give every SM work; each warp's share of a unit is at least one chunk.
  const int ups = g_units_per_sm.load() > 0 ? g_units_per_sm.load() : 1;
  const int64_t target_units = static_cast<int64_t>(sm_count_for(stream)) * ups;
  int64_t splits = (target_units + group_halves / 2) / std::max<int64_t>(group_halves, 1);
  splits = std::clamp<int64_t>(splits, 1, std::max<int64_t>(1, chunks / W));

  Plan pl{};
  pl.chunks = chunks;
  pl.splits = static_cast<int32_t>(splits);
  int64_t tiles_total = 0, slots_total = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    StreamGemmPart& p = a.parts[i];
    p.unit_begin = pl.units[p.domain];
    const int64_t units = static_cast<int64_t>(p.batch) * p.groups * H * splits;
    LOCUS_CHECK(pl.units[p.domain] + units < (1LL << 30), "streaming GEMM: too many work units");
    pl.units[p.domain] += static_cast<int32_t>(units);
    p.tile_base = static_cast<int32_t>(tiles_total);
    tiles_total += static_cast<int64_t>(p.batch) * p.groups;
    p.partial_base = slots_total;
    if (H * splits > 1) slots_total += units;
  }
  int64_t all_units = 0;
  for (int d = 0; d < a.num_domains; ++d) all_units += pl.units[d];
  const int blocks = static_cast<int>(std::min<int64_t>(max_blocks, all_units));
  pl.total_ctas = blocks;
  Scratch s = scratch_for(stream, kTileCounters + static_cast<size_t>(tiles_total),
                          std::max<size_t>(1, static_cast<size_t>(slots_total) * R * MB * 32));
  pl.counters = s.counters;
  pl.partials = s.partials;
  pl.slot_bytes = slot_bytes;
  pl.ring_bytes = ring_bytes;
  stream_gemm_kernel<F, MB, H><<<blocks, kThreads<F, MB>, smem_bytes, stream>>>(a, pl);
  LOCUS_CUDA_CHECK_LAUNCH("streaming GEMM kernel launch");
}

template <StreamWeight F, int H>
void launch_for_m(StreamGemmArgs& a, cudaStream_t stream) {
  if (a.m <= 8) launch_typed<F, 1, H>(a, stream);
  else if (a.m <= 16) launch_typed<F, 2, H>(a, stream);
  else launch_typed<F, 4, H>(a, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void set_stream_gemm_tuning(const StreamGemmTuning& t) { g_units_per_sm.store(t.units_per_sm); }

bool stream_gemm_eligible(const StreamGemmArgs& a) {
  if (a.m < 1 || a.m > kStreamGemmMaxM || a.k < 1) return false;
  if (!aligned16(a.x) || a.x_ld % 8 != 0) return false;
  if (a.y_ld < 0) return false;
  for (int i = 0; i < a.num_parts; ++i) {
    const StreamGemmPart& p = a.parts[i];
    if (p.x && !aligned16(p.x)) return false;
    if (p.x_batch_stride % 8 != 0) return false;
  }
  if (a.format == StreamWeight::kBF16) {
    if (a.k % 8 != 0) return false;
    for (int i = 0; i < a.num_parts; ++i) {
      const StreamGemmPart& p = a.parts[i];
      if (!aligned16(p.w) || p.ldw % 8 != 0 || p.w_batch_stride % 8 != 0) return false;
    }
  } else {
    if (a.k % 16 != 0) return false;
  }
  return true;
}

void launch_stream_gemm(StreamGemmArgs& a, cudaStream_t stream) {
  LOCUS_CHECK(stream_gemm_eligible(a), "streaming GEMM: ineligible problem (M = ", a.m, ", K = ", a.k,
              "; needs 1 <= M <= ", kStreamGemmMaxM, " and 16-byte aligned rows)");
  LOCUS_CHECK(a.num_parts >= 1 && a.num_parts <= kStreamGemmMaxParts, "streaming GEMM: ", a.num_parts,
              " weight parts (1..", kStreamGemmMaxParts, ")");
  LOCUS_CHECK(a.num_domains >= 1 && a.num_domains <= kStreamGemmMaxDomains, "streaming GEMM: ", a.num_domains,
              " domains (1..", kStreamGemmMaxDomains, ")");
  for (int i = 0; i < a.num_parts; ++i) {
    const StreamGemmPart& p = a.parts[i];
    LOCUS_CHECK(p.w != nullptr && p.rows >= 1 && p.batch >= 1 && p.y_offset >= 0 && p.domain >= 0 &&
                    p.domain < a.num_domains,
                "streaming GEMM: part ", i, " is malformed (rows ", p.rows, ", batch ", p.batch, ", domain ", p.domain,
                ")");
    LOCUS_CHECK(p.batch == 1 || a.format == StreamWeight::kBF16, "streaming GEMM: batched NVFP4 parts are not supported");
    LOCUS_CHECK(a.format == StreamWeight::kBF16 || (p.scales != nullptr && p.global_scale != nullptr),
                "streaming GEMM: NVFP4 part ", i, " has no scales");
  }
  if (a.format == StreamWeight::kNVFP4) {
    a.swiglu ? launch_for_m<StreamWeight::kNVFP4, 2>(a, stream) : launch_for_m<StreamWeight::kNVFP4, 1>(a, stream);
  } else {
    a.swiglu ? launch_for_m<StreamWeight::kBF16, 2>(a, stream) : launch_for_m<StreamWeight::kBF16, 1>(a, stream);
  }
}

}  // namespace locus::cuda::detail
