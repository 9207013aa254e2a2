// RMSNorm, add, cast and embedding against double-precision references.
#include "ops/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ops/fp64_reference.h"
#include "test_util.h"

namespace locus {
namespace {

using testing::fresh_seed;
using testing::get;
using testing::randn;
using testing::rel_error;

using testing::ref_rmsnorm;

TEST(Rmsnorm, MatchesFp64ForBf16AndFp32) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t rows = 7, h = 129;
  Tensor w = randn({h}, DType::kBF16, seed + 1);
  for (DType dt : {DType::kBF16, DType::kFP32}) {
    Tensor x = randn({rows, h}, dt, seed, 3.0);
    Tensor y = Tensor::empty({rows, h}, dt);
    y.fill_nan_();
    ops::rmsnorm(x, w, 1e-6f, y);
    // One reduction of length H in fp32, then one rounding into y's dtype.
    EXPECT_LT(rel_error(y, ref_rmsnorm(x, w, 1e-6)),
              dt == DType::kBF16 ? testing::bf16_gemm_tolerance(h) : testing::fp32_out_gemm_tolerance(h));
  }
}

TEST(Rmsnorm, StridedRowsRank3AndInPlace) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  // x: columns [4, 68) of a [2, 3, 80] buffer (the kv_a part of a fused projection).
  Tensor buf = randn({2, 3, 80}, DType::kFP32, seed);
  Tensor before = buf.clone();
  Tensor x = buf.slice(2, 4, 68);
  Tensor w = randn({64}, DType::kFP32, seed + 1);
  std::vector<double> ref = ref_rmsnorm(x.clone(), w, 1e-5);
  ops::rmsnorm(x, w, 1e-5f, x);  // in place
  EXPECT_LT(rel_error(x, ref), testing::fp32_out_gemm_tolerance(64));
  EXPECT_TRUE(testing::bitwise_equal(buf.slice(2, 0, 4), before.slice(2, 0, 4)));
  EXPECT_TRUE(testing::bitwise_equal(buf.slice(2, 68, 80), before.slice(2, 68, 80)));
}

TEST(Add, MixedDtypesInPlaceAndStrided) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Tensor a = randn({5, 9}, DType::kBF16, seed);
  Tensor b = randn({9, 5}, DType::kFP32, seed + 1).transpose(0, 1);
  std::vector<double> ad = testing::to_doubles(a), bd = testing::to_doubles(b), ref(ad.size());
  for (size_t i = 0; i < ad.size(); ++i) ref[i] = ad[i] + bd[i];
  Tensor y = Tensor::empty({5, 9}, DType::kFP32);
  y.fill_nan_();
  ops::add(a, b, y);
  EXPECT_LT(rel_error(y, ref), 1e-7);  // one fp32 rounding
  ops::add(a, b, a);  // y aliases a
  EXPECT_LT(rel_error(a, ref), testing::kBf16RoundingBound);  // one bf16 rounding (after an exact-or-fp32-rounded sum)
  Tensor shifted = Tensor::empty({2, 10}, DType::kFP32);
  EXPECT_THROW(ops::add(shifted.slice(1, 0, 9), shifted.slice(1, 1, 10), shifted.slice(1, 1, 10)), Error);
  EXPECT_THROW(ops::add(a, Tensor::empty({5, 8}, DType::kBF16), a), Error);
}

TEST(Cast, EveryDirectionMatchesTheScalarConversions) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Tensor x = randn({6, 11}, DType::kFP32, seed, 100.0);
  Tensor xt = x.transpose(0, 1);  // strided source
  Tensor b = Tensor::empty({11, 6}, DType::kBF16), h = Tensor::empty({11, 6}, DType::kFP16);
  ops::cast(xt, b);
  ops::cast(xt, h);
  for (int64_t i = 0; i < 66; ++i) {
    const float v = static_cast<float>(get(xt, i));
    EXPECT_EQ(b.data<uint16_t>()[i], f32_to_bf16_bits(v));
    EXPECT_EQ(h.data<uint16_t>()[i], f32_to_f16_bits(v));
  }
  Tensor back = Tensor::empty({11, 6}, DType::kFP32);
  ops::cast(b, back);
  for (int64_t i = 0; i < 66; ++i) EXPECT_EQ(back.data<float>()[i], bf16_bits_to_f32(b.data<uint16_t>()[i]));
  EXPECT_THROW(ops::cast(x, Tensor::empty({6, 11}, DType::kI32)), Error);
}

TEST(Embedding, GathersRowsAndNamesBadIds) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Tensor table = randn({10, 6}, DType::kBF16, seed);
  Tensor ids = Tensor::empty({4}, DType::kI64);
  const int64_t want[4] = {3, 0, 9, 3};
  for (int i = 0; i < 4; ++i) ids.data<int64_t>()[i] = want[i];
  Tensor y = Tensor::empty({4, 6}, DType::kBF16), y32 = Tensor::empty({4, 6}, DType::kFP32);
  y.fill_nan_();
  ops::embedding(table, ids, y);
  ops::embedding(table, ids, y32);
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 6; ++c) {
      EXPECT_EQ(y.data<uint16_t>()[t * 6 + c], table.data<uint16_t>()[want[t] * 6 + c]);
      EXPECT_EQ(get(y32, t * 6 + c), get(table, want[t] * 6 + c));
    }
  Tensor bad = Tensor::empty({2}, DType::kI32);
  bad.data<int32_t>()[0] = 1;
  bad.data<int32_t>()[1] = 10;
  try {
    ops::embedding(table, bad, Tensor::empty({2, 6}, DType::kBF16));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids[1] = 10 is out of range for a table of 10 rows"), std::string::npos)
        << e.what();
  }
}

TEST(AddRmsnorm, IsAddThenRmsnormBitwise) {
  // DeepSeek's hidden size in bf16 (the decoder layer's use) and fp32 rows that are column slices.
  for (DType dt : {DType::kBF16, DType::kFP32}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dt));
    const int64_t h = dt == DType::kBF16 ? 7168 : 48;
    Tensor xbuf = randn({3, h + 8}, dt, seed, 3.0), r = randn({3, h}, dt, seed + 1), w = randn({h}, DType::kBF16, seed + 2);
    Tensor x = xbuf.slice(1, 4, 4 + h);
    Tensor want_x = x.clone(), want_y = Tensor::empty({3, h}, DType::kBF16), y = Tensor::empty({3, h}, DType::kBF16);
    ops::add(want_x, r, want_x);
    ops::rmsnorm(want_x, w, 1e-6f, want_y);
    y.fill_nan_();
    ops::add_rmsnorm(x, r, w, 1e-6f, y);
    EXPECT_TRUE(testing::bitwise_equal(x, want_x));
    EXPECT_TRUE(testing::bitwise_equal(y, want_y));
  }
  Tensor x = Tensor::zeros({2, 8}, DType::kBF16), w = Tensor::zeros({8}, DType::kBF16);
  EXPECT_THROW(ops::add_rmsnorm(x, Tensor::zeros({2, 8}, DType::kFP32), w, 1e-6f, Tensor::empty({2, 8}, DType::kBF16)),
               Error);  // r's dtype is not x's
  EXPECT_THROW(ops::add_rmsnorm(x, Tensor::zeros({2, 8}, DType::kBF16), w, 1e-6f, x), Error);  // y is x
  EXPECT_THROW(ops::add_rmsnorm(x, x, w, 1e-6f, Tensor::empty({2, 8}, DType::kBF16)), Error);   // r is x
}

TEST(Rmsnorm, RejectsMismatchedWeight) {
  try {
    ops::rmsnorm(Tensor::zeros({2, 8}, DType::kBF16), Tensor::zeros({7}, DType::kBF16), 1e-6f,
                 Tensor::empty({2, 8}, DType::kBF16));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rmsnorm: weight has 7 elements but x has H=8"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace locus
