// Softmax against fp64, and top-k ordering rules (ties to the lower index, NaN last).
#include "ops/softmax_topk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/fp64_reference.h"
#include "test_util.h"

namespace locus {
namespace {

using testing::fresh_seed;
using testing::randn;
using testing::rel_error;

TEST(Softmax, MatchesFp64WithMaskedEntriesAndInPlace) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 4, n = 37;
  Tensor x = randn({m, n}, DType::kFP32, seed, 5.0);
  x.data<float>()[3] = -INFINITY;  // a masked logit
  const std::vector<double> ref = testing::ref_softmax(x);
  Tensor y = Tensor::empty({m, n}, DType::kFP32);
  y.fill_nan_();
  ops::softmax(x, y);
  EXPECT_LT(rel_error(y, ref), 1e-6);  // fp32 exp/sum/divide over 37 terms
  EXPECT_EQ(y.data<float>()[3], 0.f);
  ops::softmax(x, x);
  EXPECT_TRUE(testing::bitwise_equal(x, y));
  EXPECT_THROW(ops::softmax(Tensor::zeros({2, 3}, DType::kBF16), Tensor::empty({2, 3}, DType::kBF16)), Error);
}

TEST(Topk, DescendingWithTiesToTheLowerIndexAndNanLast) {
  Tensor x = Tensor::empty({2, 8}, DType::kFP32);
  const float row0[8] = {1.f, 3.f, NAN, 3.f, -INFINITY, 2.f, 3.f, 0.f};
  const float row1[8] = {NAN, -1.f, NAN, -1.f, -0.f, 0.f, -2.f, -1.f};
  std::copy(row0, row0 + 8, x.data<float>());
  std::copy(row1, row1 + 8, x.data<float>() + 8);
  Tensor v = Tensor::empty({2, 8}, DType::kFP32), idx = Tensor::empty({2, 8}, DType::kI32);
  ops::topk(x, 8, v, idx);
  const int32_t want0[8] = {1, 3, 6, 5, 0, 7, 4, 2};
  const int32_t want1[8] = {4, 5, 1, 3, 7, 6, 0, 2};  // -0 == 0: tie, lower index first
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(idx.data<int32_t>()[j], want0[j]) << j;
    EXPECT_EQ(idx.data<int32_t>()[8 + j], want1[j]) << j;
  }
  EXPECT_EQ(v.data<float>()[0], 3.f);
  EXPECT_TRUE(std::isnan(v.data<float>()[7]));
  Tensor v3 = Tensor::empty({2, 3}, DType::kFP32), i3 = Tensor::empty({2, 3}, DType::kI64);
  ops::topk(x, 3, v3, i3);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(i3.data<int64_t>()[j], want0[j]);
    EXPECT_EQ(i3.data<int64_t>()[3 + j], want1[j]);
  }
}

TEST(Topk, RandomRowsAgreeWithAStableSort) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 6, n = 256, k = 8;
  Tensor x = randn({m, n}, DType::kBF16, seed);  // bf16: plenty of exact ties
  Tensor v = Tensor::empty({m, k}, DType::kFP32), idx = Tensor::empty({m, k}, DType::kI32);
  ops::topk(x, k, v, idx);
  for (int64_t r = 0; r < m; ++r) {
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return testing::get(x, r * n + a) > testing::get(x, r * n + b); });
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(idx.data<int32_t>()[r * k + j], order[j]) << r << "," << j;
      EXPECT_EQ(v.data<float>()[r * k + j], testing::get(x, r * n + order[j]));
    }
  }
}

TEST(Topk, RejectsBadK) {
  Tensor x = Tensor::zeros({2, 4}, DType::kFP32);
  try {
    ops::topk(x, 5, Tensor::empty({2, 5}, DType::kFP32), Tensor::empty({2, 5}, DType::kI32));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk: k=5 is outside [0, 4]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::topk(x, 2, Tensor::empty({2, 3}, DType::kFP32), Tensor::empty({2, 2}, DType::kI32)), Error);
}

}  // namespace
}  // namespace locus
