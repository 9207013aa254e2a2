// Internal to the CUDA backend (device code): what the streaming GEMM's kernels share
// (stream_gemm.h): the launch plan, the chunk formats (how a stage holds a chunk of a row group
// and how a warp multiplies it), the stream-K unit arithmetic, and the end of a unit (finish_unit:
// the warps' row sums added in order, outputs written or partials counted). The kernels differ
// in how chunks reach shared memory: per-warp cp.async rings (stream_gemm_kernel.cu) or a TMA
// producer warp (stream_gemm_tma_kernel.cu).
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cta_trace.h"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/stream_epilogue.cuh"
#include "backends/cuda/stream_gemm.h"
#include "backends/cuda/stream_gemm_rows.h"
#include "backends/cuda/stream_gemm_rules.h"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/unit_queue.cuh"

namespace locus::cuda::detail {

static_assert(kStreamRulesMaxDomains == kStreamGemmMaxDomains, "the rules see every domain");

// Per-launch constants computed on the host.
struct Plan {
  int32_t chunks;  // C: K chunks per row (one group-half of one batch entry of a part)
  int32_t rows[kStreamGemmMaxDomains];   // rows per domain (its parts' rows end to end)
  int32_t units[kStreamGemmMaxDomains];  // units per domain: equal cuts of its rows * C chunks
  int32_t max_segments;                  // partial slots per row (units that can touch one row)
  unsigned* counters;  // [kStreamGemmMaxDomains unit counters][row-group counters...], all 0 between launches
  float4* partials;    // [row slot][segment][tile of the group][MB][32 lanes]
  int32_t total_ctas;
  int32_t slot_bytes;  // one pipeline stage: the chunk's weights, then its activation rows
  int32_t ring_bytes;  // one warp's stages
  int32_t stages;      // its ring depth: 2..4 (cp.async rings), 2..6 (TMA feed)
  int32_t stage_chunks;  // TMA feed: chunks per stage, 1 or 2 (stream_tma_cursor.h)
  int32_t overlapped;  // 1: launched to overlap the previous kernel (prefetch while it drains)
  int32_t prefetch_bytes;  // then: how much of its first unit a CTA asks L2 for
  int32_t static_first;  // 1: one domain, CTA b's first unit is unit b
  int32_t counted;       // 1: CTAs take units from the counters
  CtaTrace trace;        // StreamGemmTuning::trace
};

constexpr int kTileCounters = kStreamGemmMaxDomains;

// (Host.) A launch plan's work units for CTAs of `warps` warps of which `max_blocks` are resident
// on `sms` SMs: per domain its rows as whole rows or cut into stream-K units (`forced`:
// StreamGemmTuning::units_per_cta; units touch at most `unit_rows` rows), the partial slots per
// row, how CTAs get their units (one domain: CTA b's first is unit b; further ones, and all with
// several domains, from the counters), and the stream's counters and partials for tiles of
// `tile_floats4` float4s. Returns the CTAs to launch.
inline int plan_units(Plan& pl, const StreamGemmArgs& a, const StreamRows& work, int sms, int max_blocks, int warps,
                      int h, int forced, int unit_rows, int64_t groups_total, int64_t rows_total, int tile_floats4,
                      cudaStream_t stream) {
  pl.chunks = static_cast<int32_t>(work.chunks);
  const bool rows_whole = forced != 0 ? forced < 0 : whole_row_units(work, sms, max_blocks, warps, h);
  int64_t all_units = 0;
  for (int d = 0; d < a.num_domains; ++d) {
    pl.rows[d] = work.rows[d];
    if (work.chunks_of(d) == 0) continue;
    const int64_t units =
        rows_whole ? work.rows[d] : stream_k_units(work, d, max_blocks, warps, std::max(forced, 1), unit_rows);
    pl.units[d] = static_cast<int32_t>(units);
    all_units += units;
  }
  pl.max_segments = stream_max_segments(work, pl.units);
  const int blocks = static_cast<int>(std::min<int64_t>(max_blocks, all_units));
  pl.total_ctas = blocks;
  pl.static_first = a.num_domains == 1 ? 1 : 0;
  pl.counted = a.num_domains > 1 || all_units > blocks ? 1 : 0;
  const StreamScratch s = stream_scratch(stream, kTileCounters + static_cast<size_t>(groups_total),
                                         std::max<size_t>(1, static_cast<size_t>(rows_total) * pl.max_segments * tile_floats4));
  pl.counters = s.counters;
  pl.partials = s.partials;
  return blocks;
}

// A stage holds one chunk of a row group: its weights (kWeightBytes), then the activation rows
// that exist (m < M), kXRowBytes each, lane t's K quarter of row m at (m * 4 + t) * kXRowBytes / 4.
// Each lane reads back only what it copied itself, except the NVFP4 scale codes (a __syncwarp
// orders those). A chunk covers several tiles so that each activation load serves them all and
// the per-chunk bookkeeping is spread over more bytes.
template <StreamWeight F>
struct Format;

// NVFP4: 4 tiles x 64 K: per tile 512 bytes (16 per lane) and 64 bytes of scale codes (2 per
// lane); each lane's activations are its token's 16 K values of the chunk (one scale block). In
// the group-major layout a group's chunk is 2 KB of codes and 256 bytes of scales, each
// contiguous, and the next chunk follows them.
template <>
struct Format<StreamWeight::kNVFP4> {
  static constexpr int kGroupTiles = kNvfp4GroupTiles;
  static constexpr int kChunkK = 64;
  static constexpr int kWeightBytes = kGroupTiles * (512 + 64);
  static constexpr int kXRowBytes = 128;
  struct Source {
    const uint8_t* w[kGroupTiles];  // the lane's 16 bytes of each tile in chunk u.c0 of the row
    const uint8_t* s;               // lanes 0..15: 16 bytes of tile lane/4's chunk-u.c0 scale codes
  };
  // The weight batch entry `batch` streams: the part's own, or the table entry its id names
  // (StreamGemmPart::weight_ids; an id out of range reads entry 0, with no global scale: its
  // outputs are zero).
  __device__ static StreamWeightRef weight(const StreamGemmPart& p, int batch) {
    if (p.weight_ids == nullptr) return {p.w, p.scales, p.global_scale};
    const int32_t id = p.weight_ids[batch];
    if (id < 0 || id >= p.weight_count) {
      StreamWeightRef r = p.weight_table[0];
      r.global_scale = nullptr;
      return r;
    }
    return p.weight_table[id];
  }
  __device__ static Source source(const StreamGemmPart& p, int32_t chunks, const Segment& u, int lane) {
    const StreamWeightRef wr = weight(p, u.batch);
    Source src;
#pragma unroll
    for (int r = 0; r < kGroupTiles; ++r) {
      // Tiles past the part's end read its last tile (valid memory); their outputs are dropped.
      const int tile = min(u.group * kGroupTiles + r, p.tiles - 1);
      const int64_t at = nvfp4_tile_index(tile + u.half * p.up_offset, u.c0, chunks);
      src.w[r] = static_cast<const uint8_t*>(wr.w) + (at * 32 + lane) * 16;
    }
    const int tile = min(u.group * kGroupTiles + (lane >> 2), p.tiles - 1);
    const int64_t at = nvfp4_tile_index(tile + u.half * p.up_offset, u.c0, chunks);
    src.s = reinterpret_cast<const uint8_t*>(wr.scales) + at * 64 + (lane & 3) * 16;
    return src;
  }
  // Chunk j of a tile is j * 4 tiles after chunk 0 (group-major).
  __device__ static void issue_weights(uint32_t slot, const Source& src, int j, int64_t, int lane) {
#pragma unroll
    for (int r = 0; r < kGroupTiles; ++r)
      cp_async16(slot + r * 512 + lane * 16, src.w[r] + static_cast<int64_t>(j) * (kGroupTiles * 512), true);
    if (lane < 4 * kGroupTiles)
      cp_async16(slot + kGroupTiles * 512 + lane * 16, src.s + static_cast<int64_t>(j) * (kGroupTiles * 64), true);
  }
  // The landed chunk in `slot` times the activation rows m < m_count, into acc.
  template <int MB>
  __device__ static void mma(uint32_t slot, int lane, int m_count, float (&acc)[kGroupTiles][MB][4]) {
    mma_at<MB>(slot, slot + kGroupTiles * 512, slot + kWeightBytes, kXRowBytes, lane, m_count, acc);
  }
  // The same for a chunk whose codes, scale codes and activations (token m's 64 K values at
  // xs + m * x_row_bytes) lie apart: the TMA feed's stages of several chunks.
  template <int MB>
  __device__ static void mma_at(uint32_t codes, uint32_t scales, uint32_t xs, int x_row_bytes, int lane, int m_count,
                                float (&acc)[kGroupTiles][MB][4]) {
    const int g = lane >> 2, t = lane & 3;
    uint4 xv[MB][2];  // the lane's token's 16 K values of the chunk, read once for all tiles
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int m = 8 * b + g;
      if (m < m_count) {
        const uint32_t at = xs + m * x_row_bytes + t * 32;
        xv[b][0] = lds128(at);
        xv[b][1] = lds128(at + 16);
      } else {
        xv[b][0] = xv[b][1] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int r = 0; r < kGroupTiles; ++r)
      nvfp4_chunk_mma<MB>(lds128(codes + r * 512 + lane * 16), lds16(scales + r * 64 + lane * 2), xv, acc[r]);
  }
  // Lane t of token m = 8b + lane / 4 copies K [k0 + 16t, +16) of it: two 16-byte pieces.
  template <int MB>
  __device__ static void issue_x(uint32_t xslot, const uint16_t* x, int64_t x_ld, int64_t k0, int64_t k, int m_count,
                                 int lane) {
    const int t = lane & 3;
    const int64_t kb = k0 + 16 * t;
    const bool valid = kb < k;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int m = 8 * b + (lane >> 2);
      if (m >= m_count) continue;
      const uint16_t* src = valid ? x + m * x_ld + kb : x;
      cp_async16(xslot + (m * 4 + t) * 32, src, valid);
      cp_async16(xslot + (m * 4 + t) * 32 + 16, valid ? src + 8 : src, valid);
    }
  }
  __device__ static float out_scale(const StreamGemmPart& p, int batch) {
    const float* g = weight(p, batch).global_scale;
    return g != nullptr ? *g * kNvfp4AccUnscale : 0.f;
  }
  // Asks L2 for the segment's codes and scales: lane r < kGroupTiles takes the storage group of
  // tile r, unless tile r - 1 shares it (a group's chunks are one stretch; up rows may start
  // mid-group). Returns the bytes asked for.
  __device__ static int64_t prefetch(const StreamGemmPart& p, int32_t chunks, int64_t, const Segment& u, int lane) {
    if (p.weight_ids != nullptr) return 0;  // which weight is known only once the previous kernel is done
    auto storage_group = [&](int r) {
      return (min(u.group * kGroupTiles + r, p.tiles - 1) + u.half * p.up_offset) / kGroupTiles;
    };
    if (lane < kGroupTiles && (lane == 0 || storage_group(lane) != storage_group(lane - 1))) {
      const int64_t first = static_cast<int64_t>(storage_group(lane)) * chunks + u.c0;  // in group chunks
      prefetch_l2_bulk(static_cast<const uint8_t*>(p.w) + first * (kGroupTiles * 512), u.n * (kGroupTiles * 512));
      prefetch_l2_bulk(reinterpret_cast<const uint8_t*>(p.scales) + first * (kGroupTiles * 64), u.n * (kGroupTiles * 64));
    }
    return static_cast<int64_t>(u.n) * kWeightBytes;
  }
};

// BF16: 4 tiles (64 rows) x 64 K of the row-major weight per chunk, i.e. 128 contiguous bytes of
// each row. In a stage, row r's 16-byte piece p sits at r * 128 + (p ^ (r & 7)) * 16 (an XOR
// swizzle, so that the 8 row addresses of an ldmatrix fall into distinct bank groups), and the
// tokens' activations follow, one 128-byte row per token, swizzled the same way. A warp copy
// instruction reads 4 whole rows of the chunk (128-byte lines). The mma operands come from
// ldmatrix in the standard fragment order, so a chunk costs 16 copies, 16 + 2 MB ldmatrix and
// 16 MB mma per warp.
template <>
struct Format<StreamWeight::kBF16> {
  static constexpr int kGroupTiles = 4;
  static constexpr int kChunkK = 64;
  static constexpr int kRowBytes = 2 * kChunkK;
  static constexpr int kWeightBytes = kGroupTiles * 16 * kRowBytes;
  static constexpr int kXRowBytes = kRowBytes;
  // Where piece `piece` of row (or token) `row` of a stage lies.
  __device__ static uint32_t swizzled(int row, int piece) { return row * kRowBytes + ((piece ^ (row & 7)) << 4); }
  // Copy instruction i writes rows 4i..4i+3, lane l piece l & 7 of row 4i + (l >> 3): at
  // i * 512 + base(i & 1) (row & 7 is (l >> 3) + 4 (i & 1)).
  __device__ static uint32_t copy_base(int lane, int odd) { return swizzled((lane >> 3) + 4 * odd, lane & 7) - odd * 4 * kRowBytes; }
  struct Source {
    const uint8_t* w;    // the batch entry's weight
    const uint8_t* at;   // row (lane >> 3) of the group at K 0, plus the lane's piece (lane & 7)
    int64_t row_bytes;   // the weight's row stride in bytes
    int64_t up;          // the half's first row (SwiGLU up rows)
    int32_t row0, rows;  // the group's first row, the part's rows
  };
  __device__ static Source source(const StreamGemmPart& p, int32_t, const Segment& u, int lane) {
    Source src;
    src.w = static_cast<const uint8_t*>(p.w) + u.batch * p.w_batch_stride * 2;
    src.row_bytes = p.ldw * 2;
    src.up = u.half * p.up_offset;
    src.row0 = u.group * 64;
    src.rows = p.rows;
    src.at = src.w + (min(src.row0 + (lane >> 3), p.rows - 1) + src.up) * src.row_bytes + (lane & 7) * 16;
    return src;
  }
  // Instruction i copies rows 4i..4i+3 of the group: lane l the piece l & 7 of row 4i + (l >> 3),
  // so that each instruction reads 4 whole 128-byte lines.
  __device__ static void issue_weights(uint32_t slot, const Source& src, int j, int64_t k, int lane) {
    const uint32_t dst[2] = {slot + copy_base(lane, 0), slot + copy_base(lane, 1)};
    const int64_t kb = static_cast<int64_t>(j) * kChunkK;
    if (kb + kChunkK <= k && src.row0 + 64 <= src.rows) {  // warp-uniform: no K tail, no missing rows
      const uint8_t* from = src.at + kb * 2;
      const int64_t step = 4 * src.row_bytes;
#pragma unroll
      for (int i = 0; i < 16; ++i) cp_async16(dst[i & 1] + i * 4 * kRowBytes, from + i * step, true);
    } else {  // rows past the part's end read its last row; pieces past K are zero-filled
      const bool valid = kb + (lane & 7) * 8 < k;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int64_t row = min(src.row0 + (lane >> 3) + 4 * i, src.rows - 1) + src.up;
        const uint8_t* from = src.w + row * src.row_bytes + (lane & 7) * 16;
        cp_async16(dst[i & 1] + i * 4 * kRowBytes, valid ? from + kb * 2 : from, valid);
      }
    }
  }
  // The landed chunk in `slot` times the activation rows m < m_count, into acc. Token rows past
  // m_count read row m_count - 1 (their columns are dropped).
  template <int MB>
  __device__ static void mma(uint32_t slot, int lane, int m_count, float (&acc)[kGroupTiles][MB][4]) {
    // A of k16 step q of tile r: matrices (rows 0-7, piece 2q), (rows 8-15, 2q), (0-7, 2q+1), (8-15, 2q+1).
    uint32_t a_at[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) a_at[q] = slot + swizzled((lane & 7) + ((lane >> 3) & 1) * 8, 2 * q + (lane >> 4));
    // B of steps 2i, 2i+1: matrices (tokens 8b..8b+7, piece 4i + n), n < 4.
    uint32_t x_at[MB][2];
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        x_at[b][i] = slot + kWeightBytes + swizzled(min(8 * b + (lane & 7), m_count - 1), 4 * i + (lane >> 3));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t xb[MB][4];
#pragma unroll
      for (int b = 0; b < MB; ++b) ldmatrix_x4(x_at[b][i], xb[b]);
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int r = 0; r < kGroupTiles; ++r) {
          uint32_t w4[4];
          ldmatrix_x4(a_at[2 * i + n] + r * 16 * kRowBytes, w4);
#pragma unroll
          for (int b = 0; b < MB; ++b)
            mma_bf16_16816(acc[r][b], w4[0], w4[1], w4[2], w4[3], xb[b][2 * n], xb[b][2 * n + 1]);
        }
    }
  }
  // Lane l copies piece l & 7 (16 bytes) of the chunk's K for the tokens (l >> 3) + 4i.
  template <int MB>
  __device__ static void issue_x(uint32_t xslot, const uint16_t* x, int64_t x_ld, int64_t k0, int64_t k, int m_count,
                                 int lane) {
    const int piece = lane & 7;
    const int64_t kb = k0 + piece * 8;
    const bool valid = kb < k;
    const uint32_t dst[2] = {xslot + copy_base(lane, 0), xslot + copy_base(lane, 1)};
#pragma unroll
    for (int i = 0; i < 2 * MB; ++i) {
      if (4 * i >= m_count) break;  // warp-uniform
      const int m = (lane >> 3) + 4 * i;
      if (m < m_count) cp_async16(dst[i & 1] + i * 4 * kRowBytes, valid ? x + m * x_ld + kb : x, valid);
    }
  }
  __device__ static float out_scale(const StreamGemmPart&, int) { return 1.f; }
  // Asks L2 for the segment's weights: lane l for rows l and l + 32 of the group (K range clipped to K).
  __device__ static int64_t prefetch(const StreamGemmPart& p, int32_t, int64_t k, const Segment& u, int lane) {
    const int64_t k0 = static_cast<int64_t>(u.c0) * kChunkK, k1 = min(k, k0 + static_cast<int64_t>(u.n) * kChunkK);
    if (k1 <= k0) return 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = min(u.group * 64 + lane + 32 * h, p.rows - 1) + u.half * p.up_offset;
      const auto* w = static_cast<const uint16_t*>(p.w) + u.batch * p.w_batch_stride + row * p.ldw + k0;
      prefetch_l2_bulk(w, static_cast<uint32_t>((k1 - k0) * 2));
    }
    return (k1 - k0) * 2 * 64;
  }
};

// Writes the outputs of one finished tile: v[h] holds the tile's (gate, up) sums in C-fragment order.
template <StreamWeight F, int MB, int H>
__device__ __forceinline__ void store_tile(const StreamGemmArgs& a, const StreamGemmPart& p, int batch, int tile,
                                           int lane, const float (&v)[H][MB][4]) {
  store_fragments<MB, H>(a, p, batch, tile, lane, Format<F>::out_scale(p, batch), v);
}

// The unit of `domain` that holds chunk x of the domain's rows laid end to end: the largest i with
// start(i) = T * i / U <= x (T = rows * C chunks, U units, U <= T so that no unit is empty).
__device__ __forceinline__ int64_t unit_of(const Plan& pl, int domain, int64_t x) {
  return stream_k_unit_of(static_cast<int64_t>(pl.rows[domain]) * pl.chunks, pl.units[domain], x);
}
// How many units cut row r of `domain`, and the first of them.
__device__ __forceinline__ int row_segments(const Plan& pl, int domain, int64_t r, int64_t* first) {
  const int64_t c = pl.chunks;
  *first = unit_of(pl, domain, r * c);
  return static_cast<int>(unit_of(pl, domain, r * c + c - 1) - *first + 1);
}

// Unit `unit` of `domain`: chunks [*begin, *end) of the domain's rows laid end to end.
__device__ __forceinline__ void unit_range(const Plan& pl, int domain, int64_t unit, int64_t* begin, int64_t* end) {
  stream_k_range(static_cast<int64_t>(pl.rows[domain]) * pl.chunks, pl.units[domain], unit, begin, end);
}
// The chunks [*c0, *c1) of row r that the range [begin, end) covers.
__device__ __forceinline__ void row_chunks(int64_t c, int64_t r, int64_t begin, int64_t end, int* c0, int* c1) {
  *c0 = static_cast<int>(max(begin, r * c) - r * c);
  *c1 = static_cast<int>(min(end, r * c + c) - r * c);
}

// Row r of `domain` with chunks [c0, c1) of it as segment (unit - first unit of the row).
template <int H>
__device__ __forceinline__ Segment decode_segment(const StreamGemmArgs& a, const Plan& pl, int domain, int64_t r,
                                                  int unit, int c0, int c1) {
  Segment u = decode_row<H>(a, domain, r);
  int64_t first = 0;
  u.segments = row_segments(pl, domain, r, &first);
  u.s = static_cast<int>(unit - first);
  u.c0 = c0;
  u.n = c1 - c0;
  return u;
}

// The shared-memory slot where warp w leaves its sums for row r of the unit whose first row is
// r_first: slot w + (r - r_first) (injective, since a warp's rows start where the previous warp's
// end), R tiles x MB x 32 lanes of float4.
__device__ __forceinline__ float4* row_slot(uint8_t* slots, int slot_floats4, int w, int64_t r, int64_t r_first) {
  return reinterpret_cast<float4*>(slots) + (w + static_cast<int>(r - r_first)) * slot_floats4;
}

// A streaming warp's fp32 sums of its current row (R tiles x MB blocks of 8 tokens, in mma
// C-fragment order) as it walks its chunks [wb, we) of rows of C chunks, and how it leaves each
// row's sums in its row slot for finish_unit: start(wb, C), then next_chunk() before each chunk's
// multiply, then leave() for the last row.
template <int R, int MB>
struct RowSums {
  float acc[R][MB][4];
  int64_t row = 0, left = 0, chunks = 0;  // the row of the next chunk, that row's chunks left, C

  __device__ __forceinline__ void start(int64_t wb, int64_t c) {
    chunks = c;
    row = wb / c;
    left = (row + 1) * c - wb;
    clear();
  }
  // Before the next chunk's multiply: where the previous row is done, leaves its sums.
  __device__ __forceinline__ void next_chunk(uint8_t* slots, int warp, int64_t r_first, int lane) {
    if (left == 0) {
      leave(slots, warp, r_first, lane);
      clear();
      ++row;
      left = chunks;
    }
    --left;
  }
  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][b][e] = 0.f;
  }
  // The current row's sums into warp `warp`'s slot for it (row_slot; r_first: the unit's first row).
  __device__ __forceinline__ void leave(uint8_t* slots, int warp, int64_t r_first, int lane) const {
    float4* out = row_slot(slots, R * MB * 32, warp, row, r_first);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < MB; ++b)
        out[(r * MB + b) * 32 + lane] = make_float4(acc[r][b][0], acc[r][b][1], acc[r][b][2], acc[r][b][3]);
  }
};

__device__ __forceinline__ void add4(float (&v)[4], const float4& q) {
  v[0] += q.x;
  v[1] += q.y;
  v[2] += q.z;
  v[3] += q.w;
}

// A barrier of the W warps that stream a unit: the whole CTA, or (kConsumersOnly) barrier 1 of
// warps 0..W-1 only, where a producer warp after them never waits for the unit's end.
template <int W, bool kConsumersOnly>
__device__ __forceinline__ void unit_barrier() {
  if constexpr (kConsumersOnly) asm volatile("bar.sync 1, %0;" ::"n"(W * 32) : "memory");
  else __syncthreads();
}

// The end of a unit, after its warps have streamed: for each of its row segments (at most
// unit_rows) and each tile of the row group, a warp adds the sums of the warps that touched
// the row, in warp order, and writes the outputs directly when the segment is the whole row (no
// SwiGLU), else stores a partial; then one arrival per row group counts the partials, and the
// group's last segment adds them in segment order (deterministic either way). The rows proceed
// side by side, so the unit pays the partials' memory round trips (fence, count, read) once.
// A unit of whole rows skips the fence and the count. Run by warps 0..W-1 (threads
// 0..32 W - 1); ends with a unit_barrier.
template <StreamWeight F, int MB, int H, int W, bool kConsumersOnly = false>
__device__ __forceinline__ void finish_unit(const StreamGemmArgs& a, const Plan& pl, int domain, int unit,
                                            int64_t begin, int64_t end, uint8_t* slots, int warp, int lane,
                                            unsigned* s_last) {
  using Fmt = Format<F>;
  constexpr int R = Fmt::kGroupTiles;
  const int64_t c = pl.chunks, r_first = begin / c;
  const int rows = static_cast<int>((end - 1) / c - r_first + 1);
  auto segment = [&](int i) {
    const int64_t r = r_first + i;
    int c0, c1;
    row_chunks(c, r, begin, end, &c0, &c1);
    return decode_segment<H>(a, pl, domain, r, unit, c0, c1);
  };
  auto direct = [](const Segment& u) { return H == 1 && u.segments == 1; };
  // Partial slots: (the part's first slot row + the row) * max_segments + segment, then the tile.
  auto partial = [&](const StreamGemmPart& p, int batch_group, int half, int seg, int tile) {
    const int64_t row = static_cast<int64_t>(p.slot_row_base) + batch_group * H + half;
    return pl.partials + ((row * pl.max_segments + seg) * R + tile) * MB * 32;
  };

  for (int task = warp; task < rows * R; task += W) {  // (row segment, tile of the group)
    const int i = task / R, tile = task % R;
    const int64_t r = r_first + i;
    const Segment u = segment(i);
    const StreamGemmPart& p = a.parts[u.part];
    float v[1][MB][4];
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e) v[0][b][e] = 0.f;
    for (int w = 0; w < W; ++w) {
      const int64_t wb = begin + (end - begin) * w / W, we = begin + (end - begin) * (w + 1) / W;
      if (we <= wb || we <= r * c || wb >= r * c + c) continue;  // warp w did not touch row r
      const float4* in = row_slot(slots, R * MB * 32, w, r, r_first);
#pragma unroll
      for (int b = 0; b < MB; ++b) add4(v[0][b], in[(tile * MB + b) * 32 + lane]);
    }
    if (direct(u)) {
      store_tile<F, MB, 1>(a, p, u.batch, u.group * R + tile, lane, v);
    } else {
      float4* mine = partial(p, u.batch * p.groups + u.group, u.half, u.s, tile);
#pragma unroll
      for (int b = 0; b < MB; ++b)
        __stcg(mine + b * 32 + lane, make_float4(v[0][b][0], v[0][b][1], v[0][b][2], v[0][b][3]));
    }
  }
  // A unit of whole rows (no SwiGLU) wrote every output directly: no partials to count.
  if (H == 1 && begin % c == 0 && end % c == 0) {
    unit_barrier<W, kConsumersOnly>();  // the row slots are read before the next unit's warps write them
    return;
  }
  __threadfence();  // the partials are visible before they are counted
  unit_barrier<W, kConsumersOnly>();
  if (threadIdx.x < rows) {  // one arrival per partial row segment
    const Segment u = segment(threadIdx.x);
    unsigned last = 0;
    if (!direct(u)) {
      const StreamGemmPart& p = a.parts[u.part];
      const int batch_group = u.batch * p.groups + u.group;
      int total = 0;  // the group's segments over its H rows (each row's own unit cuts)
      for (int h = 0; h < H; ++h) {
        int64_t first = 0;
        total += h == u.half ? u.segments : row_segments(pl, domain, p.row_begin + batch_group * H + h, &first);
      }
      last = atomicAdd(pl.counters + kTileCounters + p.group_base + batch_group, 1u) == static_cast<unsigned>(total - 1);
    }
    s_last[threadIdx.x] = last;
  }
  unit_barrier<W, kConsumersOnly>();
  for (int task = warp; task < rows * R; task += W) {  // the last segment of a group adds it up
    const int i = task / R, tile = task % R;
    if (!s_last[i]) continue;
    __threadfence();
    const Segment u = segment(i);
    const StreamGemmPart& p = a.parts[u.part];
    const int batch_group = u.batch * p.groups + u.group;
    float sum[H][MB][4];
#pragma unroll
    for (int h = 0; h < H; ++h) {
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[h][b][e] = 0.f;
      int64_t first = 0;
      const int segments = row_segments(pl, domain, p.row_begin + batch_group * H + h, &first);
      for (int s2 = 0; s2 < segments; ++s2) {
        const float4* src = partial(p, batch_group, h, s2, tile);
#pragma unroll
        for (int b = 0; b < MB; ++b) add4(sum[h][b], __ldcg(src + b * 32 + lane));
      }
    }
    store_tile<F, MB, H>(a, p, u.batch, u.group * R + tile, lane, sum);
    // Ready for the next launch (graph replays too); every reader of the counter has arrived.
    if (tile == 0 && lane == 0) pl.counters[kTileCounters + p.group_base + batch_group] = 0;
  }
  unit_barrier<W, kConsumersOnly>();
}

}  // namespace locus::cuda::detail
