// Internal to the CUDA backend (host and device): the TMA feed's walk over a consumer warp's
// chunks of NVFP4 weights (stream_gemm_tma_kernel.cu), and the bulk copies that put a stage's
// chunks into it. Host-callable so that a CPU test checks the walk against the tile layout
// (tests/cuda/stream_tma_cursor_test.cpp).
//
// A stage holds up to S = Plan::stage_chunks (1 or 2) consecutive chunks of one row: their codes
// side by side (chunk j's 4 tiles, 512 bytes each, at j * 2 KB), then their scale codes (chunk
// j's 4 x 64 bytes at S * 2 KB + j * 256), then the activations, an [M, 64 S] box of x (row m at
// S * 2304 + m * S * 128; chunk j's 64 K values at + j * 128). Two chunks per stage where two
// stages of them fit, because the copies, not the bytes, limit a TMA feed: a producer warp
// issuing 3 copies per one-chunk stage streams 2.0 TB/s on the H200 at 8 or 16 consumer warps
// per SM, 3.3-3.5 TB/s with two chunks per stage (cuda_stream_probe --producer, 2026-12-05).
#pragma once
#include <cstdint>

#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/stream_gemm_rows.h"

namespace locus::cuda::detail {

constexpr int kTmaMaxStageChunks = 2;
constexpr int kTmaChunkCodeBytes = kNvfp4GroupTiles * kNvfp4TileBytes;  // one chunk's codes: 2 KB
constexpr int kTmaChunkScaleBytes = kNvfp4GroupTiles * 64;              // and its scale codes
constexpr int kTmaChunkWeightBytes = kTmaChunkCodeBytes + kTmaChunkScaleBytes;
constexpr int kTmaChunkXRowBytes = 128;  // one token's 64 K values

// Where things lie in a stage of S chunks (the layout above), for the producer's copies and
// expected bytes, the consumers' reads and the host's sizing.
struct TmaStageLayout {
  int S;
  LOCUS_HD int codes(int j) const { return j * kTmaChunkCodeBytes; }
  LOCUS_HD int scales(int j) const { return S * kTmaChunkCodeBytes + j * kTmaChunkScaleBytes; }
  LOCUS_HD int x(int j) const { return S * kTmaChunkWeightBytes + j * kTmaChunkXRowBytes; }  // token 0's
  LOCUS_HD int x_row_bytes() const { return S * kTmaChunkXRowBytes; }
  LOCUS_HD int bytes(int m) const { return S * kTmaChunkWeightBytes + m * x_row_bytes(); }
  // What a stage's barrier expects: n chunks' weights and the whole activation box of m tokens.
  LOCUS_HD int landed_bytes(int n, int m) const { return n * kTmaChunkWeightBytes + m * x_row_bytes(); }
  // The chunks a stage takes: up to S, within what is left of the warp's share and of the row.
  // (The producer and the consumers each count a warp's stages with it: they must agree. Written
  // as min(S, n) in 64 bits: the form n < S ? n : S costs the kernel's M = 9..16 forms a spill.)
  LOCUS_HD int chunks(int64_t share_left, int64_t row_left) const {
    const int64_t n = share_left < row_left ? share_left : row_left;
    return static_cast<int>(S < n ? static_cast<int64_t>(S) : n);
  }
};

// The cursor over the chunks of `domain`'s rows laid end to end (x = row * C + c): the next
// chunk, its row and chunk within the row, and, where the row group's 4 tiles are one storage
// group (tiles 4g..4g+3 of the part, all within it), that chunk's codes and scales (each 4 tiles
// side by side: one copy each); nullptr where the chunk is copied tile by tile. `PlanT` has
// `chunks` (C), `rows[domain]` and `stage_chunks`.
template <int H, class PlanT>
struct TmaChunkCursor {
  static constexpr int R = kNvfp4GroupTiles;
  static constexpr int kScaleBytes = 64;  // scale codes per tile and chunk
  const StreamGemmArgs& a;
  const PlanT& pl;
  int domain = 0;
  int64_t x = 0, row = 0;
  int32_t c = 0;
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;

  // The storage of the cursor's row (its chunk c), where one stretch holds it.
  LOCUS_HD void locate() {
    codes = scales = nullptr;
    if (row >= pl.rows[domain]) return;  // past the last row: nothing more to copy
    const Segment u = decode_row<H>(a, domain, row);
    const StreamGemmPart& p = a.parts[u.part];
    const int t0 = u.group * R, up = u.half * static_cast<int>(p.up_offset);
    if ((t0 + up) % R != 0 || t0 + R > p.tiles) return;
    const int64_t at = nvfp4_tile_index(t0 + up, c, pl.chunks);
    codes = static_cast<const uint8_t*>(p.w) + at * kNvfp4TileBytes;
    scales = reinterpret_cast<const uint8_t*>(p.scales) + at * kScaleBytes;
  }
  LOCUS_HD void seek(int64_t chunk) {
    x = chunk;
    row = chunk / pl.chunks;
    c = static_cast<int32_t>(chunk - row * pl.chunks);
    locate();
  }
  // The chunks the stage at the cursor takes, of a share that ends before chunk `we`: up to
  // pl.stage_chunks, within the row.
  LOCUS_HD int stage_chunks(int64_t we) const { return TmaStageLayout{pl.stage_chunks}.chunks(we - x, pl.chunks - c); }
  LOCUS_HD void advance(int n) {
    for (int i = 0; i < n; ++i) next();
  }
  // Chunk c + 1 of a tile is 4 tiles further (group-major).
  LOCUS_HD void next() {
    ++x;
    if (codes != nullptr) {
      codes += R * kNvfp4TileBytes;
      scales += R * kScaleBytes;
    }
    if (++c == pl.chunks) {
      c = 0;
      ++row;
      locate();
    }
  }

  // The copies of the weights of the `n` chunks from the cursor's (n <= stage_chunks(), so one
  // row): copy(offset in the stage, source, bytes) for each, n * (2 KB + 256) bytes in all.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
  template <class Copy>
  LOCUS_HD void weight_copies(int n, Copy&& copy) const {
    const TmaStageLayout at{pl.stage_chunks};
    if (codes != nullptr) {  // the row's chunks follow each other in its storage group
      copy(at.codes(0), codes, n * kTmaChunkCodeBytes);
      copy(at.scales(0), scales, n * kTmaChunkScaleBytes);
      return;
    }
    // Up rows that start inside a storage group, or tiles past the part's end (they read its last
    // tile, valid memory; their outputs are dropped): tile by tile.
    const Segment u = decode_row<H>(a, domain, row);
    const StreamGemmPart& p = a.parts[u.part];
    const int t0 = u.group * R, up = u.half * static_cast<int>(p.up_offset);
    for (int j = 0; j < n; ++j) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
      for (int r = 0; r < R; ++r) {
        const int tile = t0 + r < p.tiles - 1 ? t0 + r : p.tiles - 1;
        const int64_t t = nvfp4_tile_index(tile + up, c + j, pl.chunks);
        copy(at.codes(j) + r * kNvfp4TileBytes, static_cast<const uint8_t*>(p.w) + t * kNvfp4TileBytes,
             kNvfp4TileBytes);
        copy(at.scales(j) + r * kScaleBytes, reinterpret_cast<const uint8_t*>(p.scales) + t * kScaleBytes, kScaleBytes);
      }
    }
  }
};

}  // namespace locus::cuda::detail
