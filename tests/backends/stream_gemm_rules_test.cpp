// The streaming GEMM's launch rules (backends/cuda/stream_gemm_rules.h), checked on the CPU with the
// H200's numbers (132 SMs, 228 KB of shared memory per SM; 8-warp NVFP4 CTAs: two per SM at
// M <= 16, one at M = 17..32): the choices the 2026-12-03 measurements in docs/benchmarks.md
// motivated, and the invariants the kernel relies on (unit lengths, at least one unit).
#include "backends/cuda/stream_gemm_rules.h"

#include <gtest/gtest.h>

#include <random>

namespace locus::cuda::detail {
namespace {

constexpr int kSms = 132;
constexpr int kSmemPerSm = 228 * 1024;

// NVFP4 work of an N x K weight on one domain: rows of 64 output columns, chunks of 64 K.
StreamRows nvfp4_work(int64_t n, int64_t k, int domains = 1) {
  StreamRows w;
  w.chunks = k / 64;
  w.num_domains = domains;
  for (int d = 0; d < domains; ++d) w.rows[d] = static_cast<int32_t>(n / 64 / domains);
  return w;
}

TEST(StreamGemmRules, WholeRowsOnlyWhereTheyBalanceTheSms) {
  const int slots = 2 * kSms;  // 8-warp CTAs at M <= 16
  // 112 rows of 32 chunks: 32 per busy SM against 27 cut, within the partials' cost.
  EXPECT_TRUE(whole_row_units(nvfp4_work(7168, 2048), kSms, slots, kWideWarps, 1));
  // 112 rows of 112 chunks: 112 per busy SM against 95 cut.
  EXPECT_FALSE(whole_row_units(nvfp4_work(7168, 7168), kSms, slots, kWideWarps, 1));
  EXPECT_FALSE(whole_row_units(nvfp4_work(18432, 7168), kSms, slots, kWideWarps, 1));  // 288 rows, 264 slots
  EXPECT_FALSE(whole_row_units(nvfp4_work(4096, 7168), kSms, slots, kWideWarps, 1));   // 64 rows
  EXPECT_FALSE(whole_row_units(nvfp4_work(32768, 512), kSms, slots, kWideWarps, 1));   // 8 chunks: < 2 per warp
  EXPECT_FALSE(whole_row_units(nvfp4_work(7168, 2048), kSms, slots, kWideWarps, 2));   // SwiGLU needs partials
  // Two domains of half the rows each decide as one domain does.
  EXPECT_TRUE(whole_row_units(nvfp4_work(7168, 2048, 2), kSms, slots, kWideWarps, 1));
  EXPECT_FALSE(whole_row_units(nvfp4_work(7168, 7168, 2), kSms, slots, kWideWarps, 1));
}

TEST(StreamGemmRules, FourWarpsWhereEightFitOneCtaPerSmAndRowsNeedTwoRounds) {
  const int one_per_sm = kSms, two_per_sm = 2 * kSms;
  EXPECT_EQ(cta_warps(nvfp4_work(18432, 7168), one_per_sm, kSms), kNarrowWarps);  // 288 rows
  EXPECT_EQ(cta_warps(nvfp4_work(24576, 1536), one_per_sm, kSms), kNarrowWarps);  // 384 rows
  EXPECT_EQ(cta_warps(nvfp4_work(32768, 512), one_per_sm, kSms), kNarrowWarps);   // 512 rows
  EXPECT_EQ(cta_warps(nvfp4_work(7168, 18432), one_per_sm, kSms), kWideWarps);    // 112 rows
  EXPECT_EQ(cta_warps(nvfp4_work(4096, 7168), one_per_sm, kSms), kWideWarps);     // 64 rows
  for (auto [n, k] : {std::pair<int64_t, int64_t>{18432, 7168}, {32768, 512}, {7168, 7168}})
    EXPECT_EQ(cta_warps(nvfp4_work(n, k), two_per_sm, kSms), kWideWarps) << n << " x " << k;
}

TEST(StreamGemmRules, UnitsTouchMoreRowsOnlyWhereRowsAreShort) {
  EXPECT_EQ(unit_rows(nvfp4_work(7168, 7168), kWideWarps), kMinUnitRows);
  EXPECT_EQ(unit_rows(nvfp4_work(32768, 512), kWideWarps), kMinUnitRows);  // 8 chunks a row
  // MLA's W_UK BMM (K = 128: 2 chunks a row): 16 chunks for 8 warps touch up to 9 rows.
  EXPECT_EQ(unit_rows(nvfp4_work(512, 128), kWideWarps), 9);
  EXPECT_EQ(unit_rows(nvfp4_work(512, 128), kNarrowWarps), 5);
  EXPECT_EQ(unit_rows(nvfp4_work(512, 64), kWideWarps), kMaxUnitRows);  // 1 chunk a row: capped
  // With them, the BMM's 1024 rows of 2 chunks make one unit of 2 chunks per warp per CTA slot
  // (they were cut into 410 units of 5 chunks, 3 of 8 warps idle).
  StreamRows bmm = nvfp4_work(128 * 512, 128);
  EXPECT_EQ(stream_k_units(bmm, 0, kSms, kWideWarps, 1, unit_rows(bmm, kWideWarps)), 2048 / 16);
  EXPECT_EQ(stream_k_units(bmm, 0, kSms, kWideWarps, 1, kMinUnitRows), 410);
}

TEST(StreamGemmRules, StreamKCutsOneUnitPerCtaWithinTheRowBound) {
  EXPECT_EQ(stream_k_units(nvfp4_work(7168, 7168), 0, 2 * kSms, kWideWarps, 1, kMinUnitRows), 2 * kSms);
  EXPECT_EQ(stream_k_units(nvfp4_work(7168, 7168), 0, 2 * kSms, kWideWarps, 2, kMinUnitRows), 4 * kSms);
  // Any work: at least one unit, no more units than chunks, and no unit longer than
  // (rows - 1) * C + 1 chunks (so that it touches at most rows = unit_rows(w, warps) rows).
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20000; ++trial) {
    StreamRows w;
    w.chunks = 1 + static_cast<int64_t>(rng() % 300);
    w.num_domains = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < w.num_domains; ++d) w.rows[d] = static_cast<int32_t>(1 + rng() % 700);
    const int max_blocks = 1 + static_cast<int>(rng() % 600), warps = rng() % 2 ? kWideWarps : kNarrowWarps;
    const int per_cta = 1 + static_cast<int>(rng() % 5);
    for (int d = 0; d < w.num_domains; ++d) {
      const int rows = unit_rows(w, warps);
      ASSERT_GE(rows, kMinUnitRows);
      ASSERT_LE(rows, kMaxUnitRows);
      const int64_t t = w.chunks_of(d), units = stream_k_units(w, d, max_blocks, warps, per_cta, rows);
      ASSERT_GE(units, 1);
      ASSERT_LE(units, t);
      ASSERT_LE((t + units - 1) / units, (rows - 1) * w.chunks + 1) << "C " << w.chunks << " T " << t;
    }
  }
}

// The TMA feed runs one CTA per SM: its units may touch enough rows that stream-K cuts exactly one
// unit per SM at every DeepSeek-V3 shape (with unit_rows alone, 18432 x 7168 would need 144
// units for 132 CTAs: a second round for 12 of them).
TEST(StreamGemmRules, OneUnitPerSmWhereUnitsMayTouchTheirRows) {
  EXPECT_EQ(unit_rows_one_per_cta(nvfp4_work(18432, 7168), kSms, kWideWarps), 4);  // 244 chunks of 112-chunk rows
  EXPECT_EQ(unit_rows_one_per_cta(nvfp4_work(7168, 7168), kSms, kWideWarps), kMinUnitRows);
  EXPECT_EQ(unit_rows_one_per_cta(nvfp4_work(32768, 512), kSms, kWideWarps), 5);  // 32 chunks of 8-chunk rows
  EXPECT_EQ(unit_rows_one_per_cta(nvfp4_work(512, 64), kSms, kWideWarps), kMaxUnitRows);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{7168, 7168}, {18432, 7168}, {7168, 18432}, {4096, 7168},
                      {24576, 1536}, {32768, 512}, {7168, 2048}}) {
    for (int h : {1, 2}) {
      StreamRows w = nvfp4_work(n, k);
      w.rows[0] *= h;  // SwiGLU: gate and up rows
      const int rows = unit_rows_one_per_cta(w, kSms, kWideWarps);
      const int64_t units = stream_k_units(w, 0, kSms, kWideWarps, 1, rows);
      EXPECT_LE(units, kSms) << n << " x " << k << " h " << h;
      // Every unit within the row bound the slots were sized for.
      const int64_t longest = (w.chunks_total() + units - 1) / units;
      EXPECT_LE((longest - 1 + w.chunks - 1) / w.chunks + 1, rows) << n << " x " << k << " h " << h;
    }
  }
}

// The rings kernel's resident CTAs (two 8-warp CTAs per SM at M <= 16) take one unit each where
// units may touch the rows that needs, at the decode step's shapes that unit_rows alone would cut
// into a second round: DeepSeek-V3's dense gate/up with SwiGLU (576 rows of 112 chunks) and the
// experts' by-id projections of one token (8 or 9 experts: 512-576 SwiGLU rows of 112 chunks,
// 896-1008 down rows of 32).
TEST(StreamGemmRules, ResidentCtasTakeOneUnitEachAtTheDecodeStepsShapes) {
  const int slots = 2 * kSms;
  auto rows_of = [](int64_t rows, int64_t chunks) {
    StreamRows w;
    w.chunks = chunks;
    w.rows[0] = static_cast<int32_t>(rows);
    return w;
  };
  for (const StreamRows& w : {rows_of(576, 112), rows_of(512, 112), rows_of(896, 32), rows_of(1008, 32)}) {
    SCOPED_TRACE(::testing::Message() << w.rows[0] << " rows of " << w.chunks << " chunks");
    const int rows = unit_rows_one_per_cta(w, slots, kWideWarps);
    const int64_t units = stream_k_units(w, 0, slots, kWideWarps, 1, rows);
    EXPECT_LE(units, slots);
    const int64_t longest = (w.chunks_total() + units - 1) / units;
    EXPECT_LE((longest - 1 + w.chunks - 1) / w.chunks + 1, rows);
  }
  // What unit_rows alone gives: a second round.
  EXPECT_GT(stream_k_units(rows_of(576, 112), 0, slots, kWideWarps, 1, unit_rows(rows_of(576, 112), kWideWarps)), slots);
  EXPECT_GT(stream_k_units(rows_of(896, 32), 0, slots, kWideWarps, 1, unit_rows(rows_of(896, 32), kWideWarps)), slots);
}

// The stream-K arithmetic both kernels share: the ranges tile [0, T) in order, stream_k_unit_of
// inverts them, and no row of C chunks meets more units than the partial slots the launch sizes
// (stream_max_segments), for random rows, row lengths and unit counts over 1-3 domains.
TEST(StreamGemmRules, StreamKUnitsTileTheWorkAndFitThePartialSlots) {
  std::mt19937_64 rng(20261204);
  for (int trial = 0; trial < 2000; ++trial) {
    StreamRows w;
    w.chunks = 1 + static_cast<int64_t>(rng() % 120);
    w.num_domains = 1 + static_cast<int>(rng() % 3);
    int32_t units[kStreamRulesMaxDomains] = {};
    for (int d = 0; d < w.num_domains; ++d) {
      w.rows[d] = static_cast<int32_t>(rng() % 40);  // a domain may have no rows
      if (w.chunks_of(d) > 0) units[d] = static_cast<int32_t>(1 + rng() % w.chunks_of(d));
    }
    const int32_t slots = stream_max_segments(w, units);
    for (int d = 0; d < w.num_domains; ++d) {
      const int64_t t = w.chunks_of(d);
      if (t == 0) continue;
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " C " << w.chunks << " rows " << w.rows[d] << " units "
                                        << units[d]);
      int64_t expect_begin = 0;
      for (int64_t u = 0; u < units[d]; ++u) {
        int64_t begin, end;
        stream_k_range(t, units[d], u, &begin, &end);
        ASSERT_EQ(begin, expect_begin);
        ASSERT_LT(begin, end) << "unit " << u << " is empty";
        for (int64_t x : {begin, end - 1}) ASSERT_EQ(stream_k_unit_of(t, units[d], x), u) << "chunk " << x;
        expect_begin = end;
      }
      ASSERT_EQ(expect_begin, t);
      for (int64_t r = 0; r < w.rows[d]; ++r) {
        const int64_t meets =
            stream_k_unit_of(t, units[d], r * w.chunks + w.chunks - 1) - stream_k_unit_of(t, units[d], r * w.chunks) + 1;
        ASSERT_LE(meets, slots) << "row " << r;
      }
    }
  }
}

TEST(StreamGemmRules, RingDepthKeepsTwoCtasPerSmWhereItCan) {
  const int nvfp4_chunk = 4 * (512 + 64);
  // M = 1: a stage is the chunk plus one 128-byte activation row; 10 row slots of 4 tiles.
  EXPECT_EQ(ring_stages(nvfp4_chunk + 128, kWideWarps, 10 * 4 * 512, 4, kSmemPerSm), 4);
  // M = 32: 32 activation rows per stage and 4 times the row slots fit two stages on one CTA.
  EXPECT_EQ(ring_stages(nvfp4_chunk + 32 * 128, kWideWarps, 10 * 4 * 4 * 512, 4, kSmemPerSm), 2);
}

TEST(StreamGemmRules, OnlyFullGridsOverlapThePreviousKernel) {
  EXPECT_TRUE(overlaps_previous(2 * kSms, 2 * kSms));
  EXPECT_FALSE(overlaps_previous(112, 2 * kSms));  // whole rows of 7168 x 7168
}

}  // namespace
}  // namespace locus::cuda::detail
