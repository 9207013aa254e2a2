// Internal to the CUDA backend (host and device): how the streaming GEMM's rows of work map to
// its weight parts (stream_gemm.h). Host-callable so that CPU-side tests can walk the same rows
// the kernels walk (tests/cuda/stream_tma_cursor_test.cpp).
#pragma once
#include <cstdint>

#include "backends/cuda/stream_gemm.h"
#include "core/float_convert.h"  // LOCUS_HD

namespace locus::cuda::detail {

// One row segment: chunks [c0, c0 + n) of one row group (kGroupTiles 16-row tiles) of one half
// (gate or up) of one batch entry of one part; segment s of the row's `segments`.
struct Segment {
  int32_t part, batch, group, half, s, segments, c0, n;
};

// The part, batch entry, row group and half of row r of `domain` (the rest of the Segment zero).
template <int H>
LOCUS_HD Segment decode_row(const StreamGemmArgs& a, int domain, int64_t r) {
  Segment u{};
  for (int q = 0; q < a.num_parts; ++q) {
    const StreamGemmPart& cand = a.parts[q];
    if (cand.domain == domain && r >= cand.row_begin && r < cand.row_begin + cand.batch * cand.groups * H) {
      u.part = q;
      break;
    }
  }
  const StreamGemmPart& p = a.parts[u.part];
  // Rows are (batch entry, group, half)-major in that order: a group's gate and up rows are
  // neighbours, so one unit often covers both.
  const int local = static_cast<int>(r - p.row_begin);
  u.half = local % H;
  const int batch_group = local / H;
  u.batch = batch_group / p.groups;
  u.group = batch_group % p.groups;
  return u;
}

}  // namespace locus::cuda::detail
