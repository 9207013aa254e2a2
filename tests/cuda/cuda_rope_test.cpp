// apply_rope on CUDA (through ops::apply_rope) against fp64 and the CPU op: interleaved (MLA) and
// rotate-half pairs, bf16 and fp32, i32 and i64 positions, the strided views MLA rotates (the
// rope columns of q [T, H, 192] and of the latent cache rows), dims that take the scalar path,
// and NaN for out-of-range device-side positions.
#include <gtest/gtest.h>

#include <climits>

#include "cuda_test_util.h"
#include "ops/fp64_reference.h"
#include "ops/rope.h"

namespace locus::testing {
namespace {

ops::RopeConfig yarn_config(int64_t dim) {  // DeepSeek-V3's YaRN parameters
  ops::RopeConfig c;
  c.dim = dim;
  c.yarn = true;
  c.factor = 40.0;
  c.original_max_position = 4096;
  c.mscale = 1.0;
  c.mscale_all_dim = 1.0;
  return c;
}

ops::RopeTable to_gpu(const ops::RopeTable& t) {
  ops::RopeTable g = t;
  g.cos = testing::to_gpu(t.cos);
  g.sin = testing::to_gpu(t.sin);
  return g;
}

Tensor positions_tensor(const std::vector<int64_t>& pos, DType dt) {
  Tensor p = Tensor::empty({static_cast<int64_t>(pos.size())}, dt);
  for (size_t i = 0; i < pos.size(); ++i) {
    if (dt == DType::kI32) p.data<int32_t>()[i] = static_cast<int32_t>(pos[i]);
    else p.data<int64_t>()[i] = pos[i];
  }
  return p;
}

// fp32 rotation, then one rounding: bf16 unit roundoff 2^-8, fp32 a few ulps (as the CPU test).
double rope_tolerance(DType dt) { return dt == DType::kBF16 ? kBf16RoundingBound : 1e-6; }

struct RopeCase {
  int64_t tokens, heads, dim;
  DType dt, pos;
};

TEST(CudaRope, MatchesFp64AndCpuForBothPairingsDtypesAndShapes) {
  LOCUS_REQUIRE_GPU();
  const int64_t max_pos = 300;
  const RopeCase cases[] = {
      {5, 3, 64, DType::kBF16, DType::kI32},  // vector path in both pairings
      {1, 1, 64, DType::kFP32, DType::kI64},
      {37, 16, 64, DType::kBF16, DType::kI64},
      {7, 2, 8, DType::kFP32, DType::kI32},   // interleaved vector, rotate-half scalar (half = 4)
      {3, 5, 6, DType::kBF16, DType::kI32},   // half = 3: scalar in both
  };
  for (const RopeCase& c : cases) {
    const ops::RopeTable table = ops::make_rope_table(yarn_config(c.dim), max_pos);
    const ops::RopeTable gtable = to_gpu(table);
    for (bool inter : {true, false}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " T " << c.tokens << " H " << c.heads << " dim "
                                        << c.dim << " interleaved " << inter);
      std::mt19937_64 rng(seed);
      std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
      for (auto& p : pos) p = static_cast<int64_t>(rng() % max_pos);
      pos.back() = max_pos - 1;
      const Tensor positions = positions_tensor(pos, c.pos);
      Tensor x = randn({c.tokens, c.heads, c.dim}, c.dt, seed + 1);
      Tensor gx = testing::to_gpu(x);
      ops::apply_rope(gx, testing::to_gpu(positions), gtable, inter);
      Tensor x_cpu = x.clone();
      ops::apply_rope(x_cpu, positions, table, inter);
      const Tensor out = fetch(gx);
      EXPECT_LT(rel_error(out, ref_rope(x, pos, table, inter)), rope_tolerance(c.dt));
      EXPECT_LT(rel_error(out, to_doubles(x_cpu)), rope_tolerance(c.dt));
    }
  }
}

TEST(CudaRope, RotatesTheRopeSlicesOfQAndOfTheLatentCacheAsMlaDoes) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t T = 6, H = 4, dn = 128, dr = 64, dc = 512, cap = 10, len = 2;
  const ops::RopeTable table = ops::make_rope_table(yarn_config(dr), 64);
  const Tensor positions = positions_tensor({2, 3, 4, 5, 6, 63}, DType::kI32);
  const Tensor gpos = testing::to_gpu(positions);
  // q [T, H, dn + dr]: only q[..., dn:] rotates.
  Tensor q = randn({T, H, dn + dr}, DType::kBF16, seed);
  Tensor gq = testing::to_gpu(q);
  ops::apply_rope(gq.slice(2, dn, dn + dr), gpos, to_gpu(table), true);
  Tensor q_cpu = q.clone();
  ops::apply_rope(q_cpu.slice(2, dn, dn + dr), positions, table, true);
  Tensor out = fetch(gq);
  EXPECT_TRUE(bitwise_equal(out.slice(2, 0, dn), q.slice(2, 0, dn)));
  EXPECT_LT(rel_error(out.slice(2, dn, dn + dr), to_doubles(q_cpu.slice(2, dn, dn + dr))), kBf16RoundingBound);
  EXPECT_LT(rel_error(out.slice(2, dn, dn + dr), ref_rope(q.slice(2, dn, dn + dr), {2, 3, 4, 5, 6, 63}, table, true)),
            kBf16RoundingBound);
  // k_pe: rows [len, len + 3) of the cache, columns [dc, dc + dr), as [n, 1, dr]; positions slice.
  Tensor latent = randn({cap, dc + dr}, DType::kBF16, seed + 1);
  auto k_pe = [&](const Tensor& cache) { return cache.slice(0, len, len + 3).slice(1, dc, dc + dr).unsqueeze(1); };
  Tensor glat = testing::to_gpu(latent);
  ops::apply_rope(k_pe(glat), gpos.slice(0, 3, 6), to_gpu(table), true);
  Tensor lat_cpu = latent.clone();
  ops::apply_rope(k_pe(lat_cpu), positions.slice(0, 3, 6), table, true);
  out = fetch(glat);
  EXPECT_TRUE(bitwise_equal(out.slice(0, 0, len), latent.slice(0, 0, len)));
  EXPECT_TRUE(bitwise_equal(out.slice(0, len + 3, cap), latent.slice(0, len + 3, cap)));
  EXPECT_TRUE(bitwise_equal(out.slice(1, 0, dc), latent.slice(1, 0, dc)));
  EXPECT_LT(rel_error(k_pe(out), to_doubles(k_pe(lat_cpu))), kBf16RoundingBound);
  EXPECT_LT(rel_error(k_pe(out), ref_rope(k_pe(latent), {5, 6, 63}, table, true)), kBf16RoundingBound);
}

TEST(CudaRope, OutOfRangeDevicePositionsGiveNanAndTheRestMatches) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t max_pos = 16, T = 6, H = 3, dn = 8, dr = 64;
  const ops::RopeTable table = ops::make_rope_table(yarn_config(dr), max_pos);
  const std::vector<int64_t> pos = {0, -1, 15, max_pos, INT64_MAX, 5};
  const bool bad[] = {false, true, false, true, true, false};
  for (bool inter : {true, false}) {
    SCOPED_TRACE(inter);
    Tensor q = randn({T, H, dn + dr}, DType::kFP32, seed);
    Tensor gq = testing::to_gpu(q);
    ops::apply_rope(gq.slice(2, dn, dn + dr), testing::to_gpu(positions_tensor(pos, DType::kI64)), to_gpu(table),
                    inter);
    const Tensor out = fetch(gq);
    EXPECT_TRUE(bitwise_equal(out.slice(2, 0, dn), q.slice(2, 0, dn)));  // never written
    for (int64_t t = 0; t < T; ++t) {
      if (!bad[t]) continue;
      for (int64_t i = 0; i < H * dr; ++i) EXPECT_TRUE(std::isnan(get(out.select(0, t).slice(1, dn, dn + dr), i)));
    }
    // The good tokens match the CPU op on the good positions.
    std::vector<int64_t> good_pos;
    for (int64_t t = 0; t < T; ++t) good_pos.push_back(bad[t] ? 0 : pos[t]);
    Tensor q_cpu = q.clone();
    ops::apply_rope(q_cpu.slice(2, dn, dn + dr), positions_tensor(good_pos, DType::kI64), table, inter);
    for (int64_t t = 0; t < T; ++t) {
      if (bad[t]) continue;
      EXPECT_LT(rel_error(out.select(0, t), to_doubles(q_cpu.select(0, t))), rope_tolerance(DType::kFP32)) << t;
    }
  }
}

}  // namespace
}  // namespace locus::testing
