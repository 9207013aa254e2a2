// The routing's strict total order on (selection score, expert) pairs, which the CPU's top-k
// uses (backends/cpu/moe_routing.cpp): a number before NaN, larger first, lower index on ties.
// Host and device code: the CPU tests check that the kernel's integer key gives the same order.
#pragma once
#include <cstdint>

#include "core/float_convert.h"  // LOCUS_HD, f32_bits

namespace locus::cuda::detail {

// a ranks before b.
LOCUS_HD bool ranks_before(float va, int ia, float vb, int ib) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// An unsigned key whose order is ranks_before's before the index tie-break: a larger key ranks
// before, equal keys are equal scores. NaN is 0 (after every number), -0 is +0 (they compare
// equal), and every other float maps monotonically onto 0x007fffff (-inf) .. 0xff800000 (+inf).
// The kernel takes a warp's best with two warp reductions of it (the key, then the lowest index
// at that key) instead of five rounds of shuffles and comparisons.
LOCUS_HD uint32_t route_order_key(float v) {
  if (v != v) return 0u;
  const uint32_t b = f32_bits(v == 0.f ? 0.f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

}  // namespace locus::cuda::detail
