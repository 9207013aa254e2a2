// RoPE: YaRN tables against a double-precision transcription of the Hugging Face formulas
// (DeepSeek-V3 parameters), and apply_rope for interleaved (MLA) and rotate-half pairs.
#include "ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "ops/fp64_reference.h"
#include "test_util.h"

namespace locus {
namespace {

using testing::fresh_seed;
using testing::get;
using testing::randn;
using testing::rel_error;

ops::RopeConfig deepseek_v3() {
  ops::RopeConfig c;
  c.dim = 64;
  c.theta = 10000.0;
  c.yarn = true;
  c.factor = 40.0;
  c.original_max_position = 4096;
  c.beta_fast = 32.0;
  c.beta_slow = 1.0;
  c.mscale = 1.0;
  c.mscale_all_dim = 1.0;
  return c;
}

// transformers' YaRN inverse frequencies, written out independently.
std::vector<double> yarn_inv_freq(const ops::RopeConfig& c) {
  const double pi = std::acos(-1.0);
  auto dim_for = [&](double rot) {
    return c.dim * std::log(c.original_max_position / (rot * 2 * pi)) / (2 * std::log(c.theta));
  };
  double low = std::max(std::floor(dim_for(c.beta_fast)), 0.0);
  double high = std::min(std::ceil(dim_for(c.beta_slow)), static_cast<double>(c.dim - 1));
  if (low == high) high += 0.001;
  std::vector<double> f;
  for (int64_t i = 0; i < c.dim / 2; ++i) {
    const double pos_freq = std::pow(c.theta, 2.0 * i / c.dim);
    const double extra = 1 / pos_freq, inter = 1 / (c.factor * pos_freq);
    double ramp = (i - low) / (high - low);
    ramp = std::min(1.0, std::max(0.0, ramp));
    const double extra_factor = 1 - ramp;
    f.push_back(inter * (1 - extra_factor) + extra * extra_factor);
  }
  return f;
}

double mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

TEST(RopeTable, YarnMatchesTheHuggingFaceFormulaForDeepSeekV3) {
  const ops::RopeConfig c = deepseek_v3();
  const int64_t positions = 5000;
  ops::RopeTable t = ops::make_rope_table(c, positions);
  ASSERT_EQ(t.cos.shape(), (Shape{positions, 32}));
  std::vector<double> f = yarn_inv_freq(c);
  // V3: low = floor(10.2) = 10, high = ceil(22.9) = 23 -> dims < 10 keep theta^(-2i/d), dims >= 23 divided by 40.
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_NEAR(f[31], std::pow(10000.0, -62.0 / 64) / 40, 1e-18);
  for (int64_t p : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{4095}, int64_t{4999}})
    for (int64_t i = 0; i < 32; ++i) {
      const double a = p * f[i];  // attention factor mscale(40, 1) / mscale(40, 1) = 1
      EXPECT_NEAR(t.cos.data<float>()[p * 32 + i], std::cos(a), 1e-7) << p << "," << i;
      EXPECT_NEAR(t.sin.data<float>()[p * 32 + i], std::sin(a), 1e-7) << p << "," << i;
    }
  // Softmax scale factor: mscale(40, mscale_all_dim = 1) = 0.1 ln 40 + 1 = 1.3689; squared by attention.
  EXPECT_NEAR(t.softmax_mscale, 0.1 * std::log(40.0) + 1.0, 1e-15);
  EXPECT_NEAR(192.0 / std::sqrt(192.0) / 192.0 * t.softmax_mscale * t.softmax_mscale, 0.1353, 1e-4);
}

TEST(RopeTable, AttentionFactorFollowsMscaleRules) {
  ops::RopeConfig c = deepseek_v3();
  c.mscale = 0.707;  // V2-Lite: both 0.707 -> cos/sin factor 1, softmax factor mscale(40, 0.707)
  c.mscale_all_dim = 0.707;
  ops::RopeTable t = ops::make_rope_table(c, 2);
  EXPECT_NEAR(t.cos.data<float>()[0], 1.0, 1e-7);
  EXPECT_NEAR(t.softmax_mscale, mscale(40, 0.707), 1e-12);
  c.mscale = 1.0;  // mscale_all_dim unset: cos/sin carry mscale(factor), softmax unscaled
  c.mscale_all_dim = 0.0;
  t = ops::make_rope_table(c, 2);
  EXPECT_NEAR(t.cos.data<float>()[0], mscale(40, 1.0), 1e-6);
  EXPECT_EQ(t.softmax_mscale, 1.0);
  ops::RopeConfig plain;
  plain.dim = 8;
  t = ops::make_rope_table(plain, 3);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_NEAR(t.sin.data<float>()[2 * 4 + i], std::sin(2 * std::pow(10000.0, -2.0 * i / 8)), 1e-7);
}

TEST(RopeTable, RejectsBadConfigs) {
  ops::RopeConfig c;
  c.dim = 63;
  EXPECT_THROW(ops::make_rope_table(c, 4), Error);
  c.dim = 64;
  EXPECT_THROW(ops::make_rope_table(c, 0), Error);
  c.yarn = true;
  c.factor = -1;
  EXPECT_THROW(ops::make_rope_table(c, 4), Error);
}

using testing::ref_rope;

TEST(ApplyRope, InterleavedAndRotateHalfMatchFp64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  ops::RopeTable table = ops::make_rope_table(deepseek_v3(), 300);
  const int64_t tokens = 5, heads = 3;
  Tensor positions = Tensor::empty({tokens}, DType::kI32);
  std::vector<int64_t> pos = {0, 7, 299, 42, 7};
  for (int64_t i = 0; i < tokens; ++i) positions.data<int32_t>()[i] = static_cast<int32_t>(pos[i]);
  for (bool inter : {true, false})
    for (DType dt : {DType::kBF16, DType::kFP32}) {
      Tensor x = randn({tokens, heads, 64}, dt, seed);
      std::vector<double> ref = ref_rope(x, pos, table, inter);
      ops::apply_rope(x, positions, table, inter);
      // fp32 rotation, then one rounding: bf16 unit roundoff 2^-8; fp32 a few ulps.
      EXPECT_LT(rel_error(x, ref), dt == DType::kBF16 ? testing::kBf16RoundingBound : 1e-6) << inter;
    }
}

TEST(ApplyRope, InterleavedEqualsRotateHalfOnDeinterleavedInput) {
  // transformers' rope_interleave path de-interleaves (2i, 2i+1) -> (i, i + d/2) and rotates
  // halves; element for element that is our interleaved rotation.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  ops::RopeTable table = ops::make_rope_table(deepseek_v3(), 64);
  Tensor positions = Tensor::empty({4}, DType::kI64);
  std::iota(positions.data<int64_t>(), positions.data<int64_t>() + 4, int64_t{30});
  Tensor x = randn({4, 2, 64}, DType::kBF16, seed);
  Tensor de = Tensor::empty({4, 2, 64}, DType::kBF16);
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t i = 0; i < 32; ++i) {
      de.data<uint16_t>()[r * 64 + i] = x.data<uint16_t>()[r * 64 + 2 * i];
      de.data<uint16_t>()[r * 64 + 32 + i] = x.data<uint16_t>()[r * 64 + 2 * i + 1];
    }
  ops::apply_rope(x, positions, table, true);
  ops::apply_rope(de, positions, table, false);
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t i = 0; i < 32; ++i) {
      ASSERT_EQ(de.data<uint16_t>()[r * 64 + i], x.data<uint16_t>()[r * 64 + 2 * i]);
      ASSERT_EQ(de.data<uint16_t>()[r * 64 + 32 + i], x.data<uint16_t>()[r * 64 + 2 * i + 1]);
    }
}

TEST(ApplyRope, TouchesOnlyTheRopeSliceAndRejectsBadPositions) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  ops::RopeTable table = ops::make_rope_table(deepseek_v3(), 16);
  // q [T, H, 192]: q_nope = [:128], q_pe = [128:]
  Tensor q = randn({3, 2, 192}, DType::kBF16, seed);
  Tensor before = q.clone();
  Tensor positions = Tensor::zeros({3}, DType::kI32);
  positions.data<int32_t>()[1] = 5;
  ops::apply_rope(q.slice(2, 128, 192), positions, table, true);
  EXPECT_TRUE(testing::bitwise_equal(q.slice(2, 0, 128), before.slice(2, 0, 128)));
  EXPECT_FALSE(testing::bitwise_equal(q.slice(2, 128, 192), before.slice(2, 128, 192)));
  // Position 0 is the identity rotation (cos 1, sin 0).
  EXPECT_TRUE(testing::bitwise_equal(q.select(0, 0), before.select(0, 0)));
  // k_pe as [T, dim].
  Tensor k = randn({3, 64}, DType::kFP32, seed + 1);
  ops::apply_rope(k, positions, table, true);
  positions.data<int32_t>()[2] = 16;
  try {
    ops::apply_rope(k, positions, table, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("positions[2] = 16 is outside the table's 16 positions"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ops::apply_rope(Tensor::zeros({3, 32}, DType::kFP32), positions, table, true), Error);
}

}  // namespace
}  // namespace locus
