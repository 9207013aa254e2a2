// The TMA feed's chunk walk (backends/cuda/stream_tma_cursor.h), on the CPU: every consumer warp's
// share of every stream-K unit, walked as the producer lane walks it (seek to the share's first
// chunk, then a stage at a time: up to S = 1 or 2 chunks of one row), copies into each stage exactly the
// bytes of its chunks' 4 tiles and their scale codes, in the stage layout, from inside the part's
// storage, and leaves the rest of the stage alone. The expected bytes come from
// the rows listed part by part (not decode_row) and the tile layout (nvfp4_layout.h). Cases: whole
// storage groups (one copy each of codes and scales), a partial last row group, SwiGLU up rows on
// and off a storage-group boundary (tile by tile), K tails, several parts over two domains. No GPU
// needed: runs wherever the CUDA backend is built.
#include "backends/cuda/stream_tma_cursor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cuda/stream_gemm_launch.h"
#include "backends/cuda/stream_gemm_rules.h"

namespace locus::cuda::detail {
namespace {

constexpr int R = kNvfp4GroupTiles;
constexpr int kChunkBytes = R * (kNvfp4TileBytes + 64);  // one chunk's codes and scale codes
static_assert(kTmaMaxStageChunks == 2 && kTmaChunkWeightBytes == kChunkBytes);

// The storage of one prepared NVFP4 weight of n rows (64-row padded) and C chunks.
struct Storage {
  std::vector<uint8_t> codes, scales;
  Storage(int64_t n, int64_t chunks)
      : codes(static_cast<size_t>(nvfp4_padded_rows(n) / 16 * chunks * kNvfp4TileBytes)),
        scales(static_cast<size_t>(nvfp4_padded_rows(n) / 16 * chunks * 64)) {}
};

struct PlanView {  // what the cursor reads of the kernel's Plan
  int32_t chunks = 0;
  int32_t rows[kStreamGemmMaxDomains] = {};
  int32_t stage_chunks = 1;  // S
};

// One row of work: row group `group` of part `part`, its gate (half 0) or up (half 1) rows.
struct Row {
  int part, group, half;
};

// Tile `tile` (of the part's 16-row tiles, clamped to its last one) of the gate or up rows, chunk c:
// its byte offset in the codes (the scales' is 1/8 of it). Group-major: ((tile / 4) C + c) 4 + tile % 4.
int64_t tile_offset(const StreamGemmPart& p, int tile, int half, int64_t c, int64_t chunks) {
  const int64_t t = std::min(tile, p.tiles - 1) + half * p.up_offset;
  return ((t / R * chunks + c) * R + t % R) * kNvfp4TileBytes;
}

// For each of the weight bytes of a stage of S chunks, the byte it should hold (nullptr: none):
// chunk j = 0..n-1 (chunk c + j of the row) has the codes of tile r at j * 2048 + r * 512 and
// their scale codes at S * 2048 + j * 256 + r * 64.
std::vector<const uint8_t*> expected_stage(const StreamGemmPart& p, const Row& row, int64_t c, int n, int S,
                                           int64_t chunks) {
  std::vector<const uint8_t*> want(S * kChunkBytes, nullptr);
  const auto* codes = static_cast<const uint8_t*>(p.w);
  const auto* scales = reinterpret_cast<const uint8_t*>(p.scales);
  for (int j = 0; j < n; ++j)
    for (int r = 0; r < R; ++r) {
      const int64_t at = tile_offset(p, row.group * R + r, row.half, c + j, chunks);
      for (int i = 0; i < kNvfp4TileBytes; ++i) want[j * R * kNvfp4TileBytes + r * kNvfp4TileBytes + i] = codes + at + i;
      for (int i = 0; i < 64; ++i) want[S * R * kNvfp4TileBytes + j * R * 64 + r * 64 + i] = scales + at / 8 + i;
    }
  return want;
}

// The copies the cursor makes for the stage of its n chunks (from chunk c of `row`, of part p
// stored in `s`): each of the chunks' bytes once, where expected_stage says, from inside the
// part's storage; nothing else.
template <class Cursor>
void check_copies(const Cursor& cur, const StreamGemmPart& p, const Row& row, int64_t c, int n, int64_t chunks,
                  const Storage& s) {
  const int S = cur.pl.stage_chunks, kStageBytes = S * kChunkBytes;
  const std::vector<const uint8_t*> want = expected_stage(p, row, c, n, S, chunks);
  std::vector<const uint8_t*> got(kStageBytes, nullptr);
  int bytes_copied = 0;
  cur.weight_copies(n, [&](int offset, const uint8_t* src, int bytes) {
    ASSERT_TRUE(offset % 16 == 0 && bytes % 16 == 0 && offset >= 0 && offset + bytes <= kStageBytes);
    bytes_copied += bytes;
    for (int i = 0; i < bytes; ++i) {
      ASSERT_EQ(got[offset + i], nullptr) << "stage byte " << offset + i << " copied twice";
      got[offset + i] = src + i;
    }
  });
  ASSERT_EQ(bytes_copied, n * kChunkBytes);  // each byte once: what the stage's barrier expects
  ASSERT_EQ(got, want);
  for (int i = 0; i < kStageBytes; ++i) {
    if (got[i] == nullptr) continue;
    const std::vector<uint8_t>& buf = i < S * R * kNvfp4TileBytes ? s.codes : s.scales;
    ASSERT_TRUE(got[i] >= buf.data() && got[i] < buf.data() + buf.size()) << "stage byte " << i;
  }
}

// Walks every warp's share (8 and 16 consumer warps) of every unit of every domain, for each cut
// into `unit_counts` units, with stages of S chunks.
template <int H>
void check_walks_of(StreamGemmArgs a, const std::vector<Storage>& storage, const std::vector<int64_t>& unit_counts,
                    int S) {
  int64_t groups_total = 0, rows_total = 0;
  const StreamRows work = plan_stream_rows(a, H, &groups_total, &rows_total);
  PlanView pl;
  pl.chunks = static_cast<int32_t>(work.chunks);
  for (int d = 0; d < a.num_domains; ++d) pl.rows[d] = work.rows[d];
  pl.stage_chunks = S;
  for (int d = 0; d < a.num_domains; ++d) {
    std::vector<Row> rows;  // domain d's rows: its parts in order, each (group, half)-major
    for (int q = 0; q < a.num_parts; ++q)
      if (a.parts[q].domain == d)
        for (int g = 0; g < a.parts[q].groups; ++g)
          for (int h = 0; h < H; ++h) rows.push_back({q, g, h});
    ASSERT_EQ(static_cast<int64_t>(rows.size()), work.rows[d]);
    const int64_t t = static_cast<int64_t>(rows.size()) * work.chunks;
    for (const int warps : {kWideWarps, 2 * kWideWarps}) {
      for (int64_t units : unit_counts) {
        units = std::min(units, t);
        for (int64_t u = 0; u < units; ++u) {
          int64_t begin = 0, end = 0;
          stream_k_range(t, units, u, &begin, &end);
          for (int w = 0; w < warps; ++w) {
            const int64_t wb = begin + (end - begin) * w / warps, we = begin + (end - begin) * (w + 1) / warps;
            TmaChunkCursor<H, PlanView> cur{a, pl};
            cur.domain = d;
            cur.seek(wb);
            for (int64_t x = wb; x < we;) {
              SCOPED_TRACE(::testing::Message() << S << " chunks per stage, domain " << d << ", " << units
                                                << " units, unit " << u << ", warp " << w << " of " << warps
                                                << ", chunk " << x);
              ASSERT_EQ(cur.x, x);
              // S chunks where the share and the row both have S left, else what they have.
              const int n = cur.stage_chunks(we);
              const int64_t c = x % work.chunks;
              ASSERT_EQ(n, std::min<int64_t>({S, we - x, work.chunks - c}));
              const Row& row = rows[x / work.chunks];
              check_copies(cur, a.parts[row.part], row, c, n, work.chunks, storage[row.part]);
              if (::testing::Test::HasFatalFailure()) return;  // one wrong stage is enough to say
              cur.advance(n);
              x += n;
            }
            EXPECT_EQ(cur.x, we);
          }
        }
      }
    }
  }
}

// The same with stages of one chunk and of two.
template <int H>
void check_walks(const StreamGemmArgs& a, const std::vector<Storage>& storage, const std::vector<int64_t>& unit_counts) {
  for (int S = 1; S <= kTmaMaxStageChunks && !::testing::Test::HasFatalFailure(); ++S)
    check_walks_of<H>(a, storage, unit_counts, S);
}

// An NVFP4 GEMM of parts (rows, domain) over K, the weights in `storage`.
StreamGemmArgs nvfp4_args(int64_t k, bool swiglu, const std::vector<std::pair<int, int>>& parts,
                          std::vector<Storage>* storage) {
  StreamGemmArgs a;
  a.format = StreamWeight::kNVFP4;
  a.swiglu = swiglu;
  a.m = 1;
  a.k = k;
  a.num_parts = static_cast<int32_t>(parts.size());
  int domains = 1;
  storage->reserve(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto [rows, domain] = parts[i];
    storage->emplace_back(swiglu ? 2 * rows : rows, nvfp4_padded_k(k) / 64);
    StreamGemmPart& p = a.parts[i];
    p.w = storage->back().codes.data();
    p.scales = reinterpret_cast<const uint16_t*>(storage->back().scales.data());
    p.rows = rows;
    p.up_offset = swiglu ? rows / kNvfp4TileRows : 0;
    p.domain = domain;
    domains = std::max(domains, domain + 1);
  }
  a.num_domains = domains;
  return a;
}

const std::vector<int64_t> kCuts = {1, 2, 7, 132, 1 << 30};  // the last: one chunk per unit

TEST(StreamTmaCursor, WholeGroupsAndAPartialLastGroup) {
  std::vector<Storage> s1, s2, s3;
  check_walks<1>(nvfp4_args(2048, false, {{4096, 0}}, &s1), s1, kCuts);
  check_walks<1>(nvfp4_args(192, false, {{200, 0}}, &s2), s2, kCuts);   // 13 tiles: the last group is partial
  check_walks<1>(nvfp4_args(1552, false, {{1024, 0}}, &s3), s3, kCuts);  // K tail: 25 chunks
}

TEST(StreamTmaCursor, SwigluUpRowsOnAndOffAStorageGroup) {
  std::vector<Storage> s1, s2, s3;
  check_walks<2>(nvfp4_args(1536, true, {{1024, 0}}, &s1), s1, kCuts);  // up rows at tile 64: whole groups
  check_walks<2>(nvfp4_args(1552, true, {{208, 0}}, &s2), s2, kCuts);   // up rows at tile 13: tile by tile
  check_walks<2>(nvfp4_args(192, true, {{16, 0}}, &s3), s3, kCuts);     // one tile of gate rows
}

TEST(StreamTmaCursor, PartsOverTwoDomains) {
  std::vector<Storage> s1, s2;
  check_walks<1>(nvfp4_args(2048, false, {{1024, 0}, {1024, 1}}, &s1), s1, kCuts);
  // Two shards per domain, SwiGLU, one of them off a storage group.
  check_walks<2>(nvfp4_args(512, true, {{256, 0}, {208, 1}, {128, 0}, {256, 1}}, &s2), s2, kCuts);
}

}  // namespace
}  // namespace locus::cuda::detail
