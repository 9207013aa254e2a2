// Internal to the CUDA backend: the host-side rules that shape a streaming GEMM launch
// (stream_gemm.h): how a launch's rows of work are cut into units, how many warps a CTA gets, how
// deep the copy rings are, whether the launch overlaps the previous kernel. Pure functions of the
// problem's size and the GPU's residency, header-only so that CPU tests pin the choices that were
// measured on the H200 (tests/backends/stream_gemm_rules_test.cpp).
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/float_convert.h"  // LOCUS_HD

namespace locus::cuda::detail {

constexpr int kStreamRulesMaxDomains = 8;  // = kStreamGemmMaxDomains
// The two CTA shapes. NVFP4 dequantizes in registers and needs about 16 warps per SM to keep both
// the issue slots and the copies busy (bench/cuda/stream_probe.cu on the H200: 16 warps per SM
// stream and dequantize at about 3.5 TB/s, 4 at 1.5-1.7); 8-warp CTAs give that with two CTAs per
// SM, 4-warp CTAs with four.
constexpr int kWideWarps = 8, kNarrowWarps = 4;
constexpr int kMinUnitRows = 3;   // rows a unit may always touch (the CTA's row slots: W + this - 1)
constexpr int kMaxUnitRows = 12;  // where rows are short, up to this many (unit_rows)

// A launch's work: per domain, rows of C chunks each (a row = one row group's half over all of K).
struct StreamRows {
  int64_t chunks = 0;  // C
  int num_domains = 1;
  int32_t rows[kStreamRulesMaxDomains] = {};
  int64_t chunks_of(int d) const { return static_cast<int64_t>(rows[d]) * chunks; }
  int64_t chunks_total() const {
    int64_t t = 0;
    for (int d = 0; d < num_domains; ++d) t += chunks_of(d);
    return t;
  }
  // Domain d's share of `n` resident CTAs (or SMs), in proportion to its chunks; at least 1.
  int64_t share(int d, int64_t n) const { return std::max<int64_t>(1, n * chunks_of(d) / chunks_total()); }
};

// How many rows one unit may touch: kMinUnitRows, or where rows are short (K of a few chunks, as
// in MLA's per-head BMMs) enough rows for a unit of two chunks per warp (a range of L chunks
// touches at most ceil((L - 1) / C) + 1 rows), up to kMaxUnitRows. Sizes the CTA's row slots.
inline int unit_rows(const StreamRows& w, int warps) {
  const int64_t c = std::max<int64_t>(1, w.chunks);
  const int64_t rows = (2 * warps - 1 + c - 1) / c + 1;
  return static_cast<int>(std::clamp<int64_t>(rows, kMinUnitRows, kMaxUnitRows));
}

// Rows a unit may touch where each of `ctas` CTAs takes one unit (the TMA feed: one CTA per SM;
// the rings kernel: its resident CTAs, where the row slots fit beside its rings):
// unit_rows, or more where units of ceil(T / ctas) chunks cross more row boundaries (a range of
// L chunks touches at most ceil((L - 1) / C) + 1 rows), up to kMaxUnitRows.
inline int unit_rows_one_per_cta(const StreamRows& w, int ctas, int warps) {
  const int64_t c = std::max<int64_t>(1, w.chunks);
  const int64_t unit = (w.chunks_total() + ctas - 1) / std::max(1, ctas);
  const int64_t rows = std::max<int64_t>(unit_rows(w, warps), (unit - 1 + c - 1) / c + 1);
  return static_cast<int>(std::clamp<int64_t>(rows, kMinUnitRows, kMaxUnitRows));
}

// Stream-K: T chunks of work laid end to end, cut into `units` (<= T) ranges of equal length.
// Unit u covers chunks [T u / U, T (u + 1) / U); chunk x lies in unit ((x + 1) U - 1) / T.
// (Host and device: the kernels and the CPU tests use the same arithmetic.)
LOCUS_HD int64_t stream_k_unit_of(int64_t t, int64_t units, int64_t x) { return ((x + 1) * units - 1) / t; }
LOCUS_HD void stream_k_range(int64_t t, int64_t units, int64_t u, int64_t* begin, int64_t* end) {
  *begin = t * u / units;
  *end = t * (u + 1) / units;
}

// Partial slots per row: units are at least floor(T / U) chunks long, so a row of C chunks meets
// at most ceil(C / that) + 1 of them (the largest over the domains with units[d] > 0).
inline int32_t stream_max_segments(const StreamRows& work, const int32_t* units) {
  int32_t segments = 1;
  for (int d = 0; d < work.num_domains; ++d) {
    const int64_t t = work.chunks_of(d);
    if (t == 0 || units[d] == 0) continue;
    segments = std::max<int32_t>(segments, static_cast<int32_t>((work.chunks - 1) / (t / units[d]) + 2));
  }
  return segments;
}

// Stream-K: a domain's T = rows * C chunks cut into units of equal length, about `per_cta` per
// resident CTA over all domains (in proportion to their work), each at least two chunks per warp
// where that leaves units to spare (so a warp's pipeline has something to overlap), and short
// enough to touch at most `rows` rows (L <= (rows - 1) * C + 1; rows = unit_rows(w, warps)).
inline int64_t stream_k_units(const StreamRows& w, int d, int max_blocks, int warps, int per_cta, int rows) {
  const int64_t t = w.chunks_of(d), total = w.chunks_total();
  const int64_t want = (static_cast<int64_t>(max_blocks) * per_cta * t + total / 2) / total;
  const int64_t max_len = static_cast<int64_t>(rows - 1) * w.chunks + 1;
  const int64_t units = std::min<int64_t>(want, t / (2 * warps));
  return std::clamp<int64_t>(std::max<int64_t>(units, (t + max_len - 1) / max_len), 1, t);
}

// About what the partials' round trips (store, fence, count, read) at the end of a stream-K unit
// cost, in chunks. The H200 (2026-12-03, back to back): 7168 x 7168 at M = 1 (per SM 112 chunks as
// whole rows, 95 cut) 20.9 us whole, 19.7 cut; 7168 x 2048 (32 whole, 27 cut) 11.9 whole, 13.6 cut.
constexpr int64_t kPartialChunks = 10;

// Whole rows as units (no partials, no counters: each CTA writes its rows' outputs) unless that
// leaves the busiest SM with more than kPartialChunks more chunks than the stream-K cut would,
// or the rows would not all run at once (a second round restarts the pipelines), or a warp would
// get fewer than two chunks of a row. SwiGLU (h = 2) always needs partials (gate and up are
// separate rows), so it takes the stream-K cut.
inline bool whole_row_units(const StreamRows& w, int sms, int max_blocks, int warps, int h) {
  if (h != 1 || w.chunks < 2 * warps) return false;
  for (int d = 0; d < w.num_domains; ++d) {
    const int64_t t = w.chunks_of(d);
    if (t == 0) continue;
    const int64_t share = w.share(d, sms);
    const int64_t whole = (w.rows[d] + share - 1) / share * w.chunks, cut = t / share;
    if (w.rows[d] > w.share(d, max_blocks) || whole > cut + kPartialChunks) return false;
  }
  return true;
}

// Whether every domain's rows fit its share of `max_blocks` resident CTAs in one round.
inline bool rows_fit_one_round(const StreamRows& w, int max_blocks) {
  for (int d = 0; d < w.num_domains; ++d)
    if (w.chunks_of(d) > 0 && w.rows[d] > w.share(d, max_blocks)) return false;
  return true;
}

// Warps per CTA: 8, unless that fits only one CTA per SM (registers and row slots at M = 17..32;
// `wide_blocks` = resident 8-warp CTAs on `sms` SMs) and the rows need more than one round of such
// CTAs: then 4, two CTAs per SM, so that one CTA's unit end overlaps the other's streaming. The
// H200 at M = 32 (2026-12-03): 4 warps faster by 19-30 % on 18432 x 7168, 24576 x 1536 and
// 32768 x 512 (288-512 rows on 132 CTAs of 8), 8 warps faster by 5-24 % on 7168 x 18432,
// 4096 x 7168 and 7168 x 2048 (64-112 rows).
inline int cta_warps(const StreamRows& w, int wide_blocks, int sms) {
  const bool one_per_sm = wide_blocks < 2 * sms;
  return one_per_sm && !rows_fit_one_round(w, wide_blocks) ? kNarrowWarps : kWideWarps;
}

// The deepest ring (2..max_stages) with which two CTAs fit an SM's `sm_bytes` of shared memory,
// else one CTA (`fixed_bytes`: the CTA's shared memory besides its W rings of `slot_bytes` stages).
inline int ring_stages(int slot_bytes, int warps, int fixed_bytes, int max_stages, int sm_bytes) {
  const int reserved = 1024 + 64;  // the runtime's share per CTA, the kernel's static variables
  for (int ctas : {2, 1}) {
    const int stages = (sm_bytes / ctas - reserved - fixed_bytes) / (warps * slot_bytes);
    if (stages >= 2) return std::min(stages, max_stages);
  }
  return 2;  // the occupancy query reports it if even this does not fit
}

// Whether a launch of `blocks` CTAs overlaps the previous kernel (programmatic dependent launch):
// only a grid that fills every one of the `max_blocks` slots; a smaller one would let the next
// launch's CTAs take the slots it leaves free before it ends, unevenly (7168 x 7168 whole rows
// back to back: 20.4 us per call plain, 24.4 overlapped).
inline bool overlaps_previous(int blocks, int max_blocks) { return blocks == max_blocks; }

}  // namespace locus::cuda::detail
