// Internal to the CUDA backend (host and device): the TMA feed's walk over a consumer warp's
// chunks of NVFP4 weights (stream_gemm_tma_kernel.cu) and the bulk copies that put one chunk into
// a stage, in the stage layout of Format<kNVFP4> (stream_gemm_device.cuh): the 4 tiles' codes,
// 512 bytes each, then their scale codes, 64 bytes each. Host-callable so that a CPU test checks
// the walk against the tile layout (tests/cuda/stream_tma_cursor_test.cpp).
#pragma once
#include <cstdint>

#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/stream_gemm_rows.h"

namespace locus::cuda::detail {

// The cursor over the chunks of `domain`'s rows laid end to end (x = row * C + c): the next
// chunk, its row and chunk within the row, and, where the row group's 4 tiles are one storage
// group (tiles 4g..4g+3 of the part, all within it), that chunk's codes and scales (each 4 tiles
// side by side: one copy each); nullptr where the chunk is copied tile by tile. `PlanT` has
// `chunks` (C) and `rows[domain]`.
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

  // The copies of the cursor's chunk's weights: copy(offset in the stage, source, bytes) for each,
  // R * (512 + 64) bytes in all.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
  template <class Copy>
  LOCUS_HD void weight_copies(Copy&& copy) const {
    if (codes != nullptr) {
      copy(0, codes, R * kNvfp4TileBytes);
      copy(R * kNvfp4TileBytes, scales, R * kScaleBytes);
      return;
    }
    // Up rows that start inside a storage group, or tiles past the part's end (they read its last
    // tile, valid memory; their outputs are dropped).
    const Segment u = decode_row<H>(a, domain, row);
    const StreamGemmPart& p = a.parts[u.part];
    const int t0 = u.group * R, up = u.half * static_cast<int>(p.up_offset);
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int r = 0; r < R; ++r) {
      const int tile = t0 + r < p.tiles - 1 ? t0 + r : p.tiles - 1;
      const int64_t at = nvfp4_tile_index(tile + up, c, pl.chunks);
      copy(r * kNvfp4TileBytes, static_cast<const uint8_t*>(p.w) + at * kNvfp4TileBytes, kNvfp4TileBytes);
      copy(R * kNvfp4TileBytes + r * kScaleBytes, reinterpret_cast<const uint8_t*>(p.scales) + at * kScaleBytes,
           kScaleBytes);
    }
  }
};

}  // namespace locus::cuda::detail
