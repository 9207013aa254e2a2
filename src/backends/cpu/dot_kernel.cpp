#include "backends/cpu/dot_kernel.h"

#include <cstring>

#include "core/error.h"

// 256-bit vector types passed between always-inline helpers; the ABI note GCC emits for them
// does not apply (nothing crosses a non-inlined call boundary by value).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace locus::cpu::detail {
namespace {

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));

#define LOCUS_AI inline __attribute__((always_inline))

LOCUS_AI v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
LOCUS_AI v8f load8(const uint16_t* p) {  // bf16 -> fp32 is exact: the bits move up by 16
  v8h h;
  std::memcpy(&h, p, sizeof(h));
  v8u u = __builtin_convertvector(h, v8u) << 16;
  return (v8f)u;  // same-size vector cast: reinterprets the bits
}
template <class T>
LOCUS_AI v8f load8_tail(const T* p, int64_t r) {  // r < 8 elements, the rest zero
  T buf[kDotLanes] = {};
  for (int64_t i = 0; i < r; ++i) buf[i] = p[i];
  return load8(buf);
}

template <int MR, int NR, class WT>
LOCUS_AI void tile_body(const float* const* x, const WT* const* w, int64_t klen, float* acc, int64_t acc_ld) {
  v8f a[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) a[i][j] = load8(acc + (i * acc_ld + j) * kDotLanes);
  const float* xp[MR];
  const WT* wp[NR];
  for (int i = 0; i < MR; ++i) xp[i] = x[i];
  for (int j = 0; j < NR; ++j) wp[j] = w[j];
  const int64_t kfull = klen & ~static_cast<int64_t>(kDotLanes - 1);
  for (int64_t k = 0; k < kfull; k += kDotLanes) {
    v8f xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = load8(xp[i] + k);
    for (int j = 0; j < NR; ++j) {
      v8f wv = load8(wp[j] + k);
      for (int i = 0; i < MR; ++i) a[i][j] += xv[i] * wv;
    }
  }
  if (kfull < klen) {
    const int64_t r = klen - kfull;
    v8f xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = load8_tail(xp[i] + kfull, r);
    for (int j = 0; j < NR; ++j) {
      v8f wv = load8_tail(wp[j] + kfull, r);
      for (int i = 0; i < MR; ++i) a[i][j] += xv[i] * wv;
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) std::memcpy(acc + (i * acc_ld + j) * kDotLanes, &a[i][j], sizeof(v8f));
}

template <int MR, int NR, class WT>
void tile_baseline(const float* const* x, const WT* const* w, int64_t klen, float* acc, int64_t acc_ld) {
  tile_body<MR, NR, WT>(x, w, klen, acc, acc_ld);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define LOCUS_HAVE_AVX2_VARIANT 1
// AVX2 without FMA: wider registers, the same roundings as the baseline variant.
template <int MR, int NR, class WT>
__attribute__((target("avx2"))) void tile_avx2(const float* const* x, const WT* const* w, int64_t klen, float* acc,
                                               int64_t acc_ld) {
  tile_body<MR, NR, WT>(x, w, klen, acc, acc_ld);
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
const Kernels<WT>& kernels() {
#if LOCUS_HAVE_AVX2_VARIANT
  static const Kernels<WT> k = use_avx2() ? make_avx2<WT>() : make_baseline<WT>();
#else
  static const Kernels<WT> k = make_baseline<WT>();
#endif
  return k;
}

template <class WT>
void dispatch(int mr, int nr, const float* const* x, const WT* const* w, int64_t klen, float* acc, int64_t acc_ld) {
  LOCUS_CHECK(mr >= 1 && mr <= kMaxTileM && nr >= 1 && nr <= kMaxTileN, "dot_tile: tile ", mr, "x", nr,
              " outside 1..", kMaxTileM, " x 1..", kMaxTileN);
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

TileShape preferred_tile(int64_t m) {
  // AVX2 has 16 ymm registers: 3x4 accumulators + 3 x vectors + 1 w vector. Baseline SSE2 splits
  // each 8-lane vector into two xmm registers, so a quarter of the tile.
  if (use_avx2()) return m == 1 ? TileShape{1, 4} : (m == 2 ? TileShape{2, 4} : TileShape{3, 4});
  return m == 1 ? TileShape{1, 4} : TileShape{2, 2};
}

const char* dot_kernel_isa() { return use_avx2() ? "avx2" : "baseline"; }

}  // namespace locus::cpu::detail
