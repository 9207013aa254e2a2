// The shared dot kernel: every tile shape, both instruction-set variants, both weight types and
// any K blocking give bit-identical dot products (the determinism the partitioned ops rely on).
#include "backends/cpu/dot_kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/float_convert.h"
#include "test_util.h"

namespace locus::cpu::detail {
namespace {

struct Operands {
  int64_t k;
  std::vector<float> x;      // 4 rows
  std::vector<uint16_t> wb;  // 4 rows, bf16 bits
  std::vector<float> wf;     // the same rows as fp32
};

Operands make(int64_t k, uint64_t seed) {
  Operands o{k, std::vector<float>(4 * k), std::vector<uint16_t>(4 * k), std::vector<float>(4 * k)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& v : o.x) v = bf16_bits_to_f32(f32_to_bf16_bits(d(rng)));
  for (int64_t i = 0; i < 4 * k; ++i) {
    o.wb[i] = f32_to_bf16_bits(d(rng));
    o.wf[i] = bf16_bits_to_f32(o.wb[i]);
  }
  return o;
}

// Dots of x rows [i0, i0 + mr) with w rows [j0, j0 + nr), K split into blocks of kb (multiple of 8).
template <class WT>
void run(DotIsa isa, const Operands& o, const std::vector<WT>& w, int i0, int mr, int j0, int nr, int64_t kb,
         float out[4][4]) {
  std::vector<float> acc(static_cast<size_t>(mr * nr * kDotLanes), 0.f);
  for (int64_t k0 = 0; k0 < o.k; k0 += kb) {
    const float* xp[kMaxTileM];
    const WT* wp[kMaxTileN];
    for (int i = 0; i < mr; ++i) xp[i] = o.x.data() + (i0 + i) * o.k + k0;
    for (int j = 0; j < nr; ++j) wp[j] = w.data() + (j0 + j) * o.k + k0;
    dot_tile_isa(isa, mr, nr, xp, wp, std::min(kb, o.k - k0), acc.data(), nr);
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) out[i0 + i][j0 + j] = reduce_lanes(acc.data() + (i * nr + j) * kDotLanes);
}

TEST(DotKernel, TileShapesVariantsWeightTypesAndKBlocksAgreeBitwise) {
  std::vector<DotIsa> isas = {DotIsa::kBaseline};
  if (dot_isa_available(DotIsa::kAvx2)) isas.push_back(DotIsa::kAvx2);
  for (int64_t k : {1, 7, 8, 61, 264}) {
    const uint64_t seed = testing::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "K=" << k << " seed=" << seed);
    Operands o = make(k, seed);
    float ref[4][4];
    run(DotIsa::kBaseline, o, o.wf, 0, 4, 0, 4, 1 << 20, ref);
    // The reference itself is the dot product (double check, loose: fp32 accumulation).
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        double s = 0, a = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          s += double(o.x[i * k + kk]) * o.wf[j * k + kk];
          a += std::fabs(double(o.x[i * k + kk]) * o.wf[j * k + kk]);
        }
        EXPECT_LE(std::fabs(ref[i][j] - s), 1e-6 * a + 1e-30);
      }
    for (DotIsa isa : isas)
      for (int64_t kb : {int64_t{8}, int64_t{16}, int64_t{256}, int64_t{1} << 20})
        for (int mr = 1; mr <= 4; ++mr)
          for (int nr = 1; nr <= 4; ++nr) {
            float got_b[4][4], got_f[4][4];
            std::memset(got_b, 0xFF, sizeof(got_b));
            std::memset(got_f, 0xFF, sizeof(got_f));
            // Tile the 4x4 block with mr x nr tiles (edge tiles smaller), as the driver does.
            for (int i0 = 0; i0 < 4; i0 += mr)
              for (int j0 = 0; j0 < 4; j0 += nr) {
                run(isa, o, o.wb, i0, std::min(mr, 4 - i0), j0, std::min(nr, 4 - j0), kb, got_b);
                run(isa, o, o.wf, i0, std::min(mr, 4 - i0), j0, std::min(nr, 4 - j0), kb, got_f);
              }
            ASSERT_EQ(std::memcmp(got_b, ref, sizeof(ref)), 0) << "bf16 w, tile " << mr << "x" << nr << " kb=" << kb;
            ASSERT_EQ(std::memcmp(got_f, ref, sizeof(ref)), 0) << "fp32 w, tile " << mr << "x" << nr << " kb=" << kb;
          }
  }
}

TEST(DotKernel, RejectsTilesOutsideTheTable) {
  const float* x[1] = {nullptr};
  const float* w[1] = {nullptr};
  float acc[8];
  EXPECT_THROW(dot_tile(5, 1, x, w, 0, acc, 1), Error);
  EXPECT_THROW(dot_tile(1, 0, x, w, 0, acc, 1), Error);
}

}  // namespace
}  // namespace locus::cpu::detail
