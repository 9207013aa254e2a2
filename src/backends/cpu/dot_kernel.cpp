#include "backends/cpu/dot_kernel.h"

#include <cstring>

#include "core/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LOCUS_HAVE_AVX2_VARIANT 1
#endif

// 256-bit vector types passed between always-inline helpers; the ABI note GCC emits for them
// does not apply (nothing crosses a non-inlined call boundary by value).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace locus::cpu::detail {
namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

namespace baseline {
#define LOCUS_TILE_FN inline __attribute__((always_inline))
#define LOCUS_TILE_AVX2 0
#include "backends/cpu/dot_tile_body.inc"
#undef LOCUS_TILE_FN
#undef LOCUS_TILE_AVX2
}  // namespace baseline

template <int MR, int NR, class WT>
void tile_baseline(const float* const* x, const WT* const* w, int64_t klen, float* acc, int64_t acc_ld) {
  baseline::tile_body<MR, NR, WT>(x, w, klen, acc, acc_ld);
}

#if LOCUS_HAVE_AVX2_VARIANT
// AVX2 without FMA: wider registers, the same roundings as the baseline variant.
namespace avx2 {
#define LOCUS_TILE_FN inline __attribute__((always_inline, target("avx2")))
#define LOCUS_TILE_AVX2 1
#include "backends/cpu/dot_tile_body.inc"
#undef LOCUS_TILE_FN
#undef LOCUS_TILE_AVX2
}  // namespace avx2

template <int MR, int NR, class WT>
__attribute__((target("avx2"))) void tile_avx2(const float* const* x, const WT* const* w, int64_t klen, float* acc,
                                               int64_t acc_ld) {
  avx2::tile_body<MR, NR, WT>(x, w, klen, acc, acc_ld);
}
#endif

template <class WT>
using TileFn = void (*)(const float* const*, const WT* const*, int64_t, float*, int64_t);

#define LOCUS_ROW(V, M) {&V<M, 1, WT>, &V<M, 2, WT>, &V<M, 3, WT>, &V<M, 4, WT>}
#define LOCUS_TABLE(V) {{LOCUS_ROW(V, 1), LOCUS_ROW(V, 2), LOCUS_ROW(V, 3), LOCUS_ROW(V, 4)}}

template <class WT>
struct Kernels {
  TileFn<WT> fn[kMaxTileM][kMaxTileN];
};

template <class WT>
Kernels<WT> make_baseline() {
  return Kernels<WT> LOCUS_TABLE(tile_baseline);
}
#if LOCUS_HAVE_AVX2_VARIANT
template <class WT>
Kernels<WT> make_avx2() {
  return Kernels<WT> LOCUS_TABLE(tile_avx2);
}
#endif

bool use_avx2() {
#if LOCUS_HAVE_AVX2_VARIANT
  static const bool v = __builtin_cpu_supports("avx2");
  return v;
#else
  return false;
#endif
}

template <class WT>
const Kernels<WT>& baseline_kernels() {
  static const Kernels<WT> k = make_baseline<WT>();
  return k;
}

template <class WT>
const Kernels<WT>& isa_kernels(DotIsa isa) {
#if LOCUS_HAVE_AVX2_VARIANT
  if (isa == DotIsa::kAvx2) {
    LOCUS_CHECK(use_avx2(), "dot_tile: the AVX2 kernel variant needs a CPU with AVX2");
    static const Kernels<WT> k = make_avx2<WT>();
    return k;
  }
#else
  LOCUS_CHECK(isa == DotIsa::kBaseline, "dot_tile: this build has no AVX2 kernel variant");
#endif
  return baseline_kernels<WT>();
}

template <class WT>
const Kernels<WT>& kernels() {
  static const Kernels<WT>& k = isa_kernels<WT>(use_avx2() ? DotIsa::kAvx2 : DotIsa::kBaseline);
  return k;
}

void check_tile(int mr, int nr) {
  LOCUS_CHECK(mr >= 1 && mr <= kMaxTileM && nr >= 1 && nr <= kMaxTileN, "dot_tile: tile ", mr, "x", nr,
              " outside 1..", kMaxTileM, " x 1..", kMaxTileN);
}

template <class WT>
void dispatch(int mr, int nr, const float* const* x, const WT* const* w, int64_t klen, float* acc, int64_t acc_ld) {
  check_tile(mr, nr);
  kernels<WT>().fn[mr - 1][nr - 1](x, w, klen, acc, acc_ld);
}

}  // namespace

void dot_tile(int mr, int nr, const float* const* x, const float* const* w, int64_t klen, float* acc, int64_t acc_ld) {
  dispatch<float>(mr, nr, x, w, klen, acc, acc_ld);
}
void dot_tile(int mr, int nr, const float* const* x, const uint16_t* const* w, int64_t klen, float* acc,
              int64_t acc_ld) {
  dispatch<uint16_t>(mr, nr, x, w, klen, acc, acc_ld);
}

bool dot_isa_available(DotIsa isa) { return isa == DotIsa::kBaseline || use_avx2(); }

void dot_tile_isa(DotIsa isa, int mr, int nr, const float* const* x, const float* const* w, int64_t klen, float* acc,
                  int64_t acc_ld) {
  check_tile(mr, nr);
  isa_kernels<float>(isa).fn[mr - 1][nr - 1](x, w, klen, acc, acc_ld);
}
void dot_tile_isa(DotIsa isa, int mr, int nr, const float* const* x, const uint16_t* const* w, int64_t klen,
                  float* acc, int64_t acc_ld) {
  check_tile(mr, nr);
  isa_kernels<uint16_t>(isa).fn[mr - 1][nr - 1](x, w, klen, acc, acc_ld);
}

TileShape preferred_tile(int64_t m) {
  // AVX2 has 16 ymm registers: 3x4 accumulators + 3 x vectors + 1 w vector. Baseline SSE2 splits
  // each 8-lane vector into two xmm registers, so a quarter of the tile.
  if (use_avx2()) return m == 1 ? TileShape{1, 4} : (m == 2 ? TileShape{2, 4} : TileShape{3, 4});
  return m == 1 ? TileShape{1, 4} : TileShape{2, 2};
}

const char* dot_kernel_isa() { return use_avx2() ? "avx2" : "baseline"; }

}  // namespace locus::cpu::detail
