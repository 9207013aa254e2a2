// CPU GEMM, fused SwiGLU GEMM and SwiGLU against fp64 references; bitwise slice and thread
// independence (the locality layer's partitioned == unpartitioned rests on these).
#include "ops/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "backends/cpu/thread_pool.h"
#include "test_util.h"

namespace locus {
namespace {

using testing::bf16_gemm_tolerance;
using testing::bitwise_equal;
using testing::fp32_out_gemm_tolerance;
using testing::fresh_seed;
using testing::get;
using testing::randn;
using testing::ref_gemm;
using testing::rel_error;


double silu_d(double g) { return g / (1.0 + std::exp(-g)); }

using locus::testing::error_text;

struct Shape3 {
  int64_t m, n, k;
};

TEST(Gemm, Bf16OutputMatchesFp64OnOddShapes) {
  for (Shape3 s : {Shape3{1, 7, 13}, Shape3{5, 33, 70}, Shape3{17, 19, 257}, Shape3{3, 4, 1000}, Shape3{50, 9, 8}}) {
    for (bool with_bias : {false, true}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "M=" << s.m << " N=" << s.n << " K=" << s.k << " bias=" << with_bias
                                        << " seed=" << seed);
      Tensor x = randn({s.m, s.k}, DType::kBF16, seed);
      Tensor w = randn({s.n, s.k}, DType::kBF16, seed + 1);
      Tensor bias = with_bias ? randn({s.n}, DType::kBF16, seed + 2) : Tensor();
      Tensor y = Tensor::empty({s.m, s.n}, DType::kBF16);
      y.fill_nan_();
      ops::gemm(x, w, bias, y);
      EXPECT_LT(rel_error(y, ref_gemm(x, w, bias)), bf16_gemm_tolerance(s.k));
    }
  }
}

TEST(Gemm, Fp32OutputWithFp32Bias) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 6, n = 21, k = 515;
  Tensor x = randn({m, k}, DType::kBF16, seed);
  Tensor w = randn({n, k}, DType::kBF16, seed + 1);
  Tensor bias = randn({n}, DType::kFP32, seed + 2);
  Tensor y = Tensor::empty({m, n}, DType::kFP32);
  y.fill_nan_();
  ops::gemm(x, w, bias, y);
  EXPECT_LT(rel_error(y, ref_gemm(x, w, bias)), fp32_out_gemm_tolerance(k));
}

TEST(Gemm, StridedOutputWritesOnlyItsSlice) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 9, n = 11, k = 40;
  Tensor x = randn({m, k}, DType::kBF16, seed);
  Tensor w = randn({n, k}, DType::kBF16, seed + 1);
  for (DType dt : {DType::kBF16, DType::kFP32}) {
    Tensor wide = Tensor::empty({m, 3 * n + 2}, dt);
    wide.fill_nan_();
    Tensor poison = wide.clone();
    Tensor y = wide.slice(1, n + 1, 2 * n + 1);  // leading dimension 3n + 2 > n
    ops::gemm(x, w, Tensor(), y);
    EXPECT_LT(rel_error(y, ref_gemm(x, w, Tensor())),
              dt == DType::kBF16 ? bf16_gemm_tolerance(k) : fp32_out_gemm_tolerance(k));
    // Everything outside the slice keeps its poison bits.
    EXPECT_TRUE(bitwise_equal(wide.slice(1, 0, n + 1), poison.slice(1, 0, n + 1)));
    EXPECT_TRUE(bitwise_equal(wide.slice(1, 2 * n + 1, 3 * n + 2), poison.slice(1, 2 * n + 1, 3 * n + 2)));
  }
}

TEST(Gemm, ColumnAndRowSlicesAreBitIdenticalToTheFullProduct) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 13, n = 29, k = 203;
  Tensor x = randn({m, k}, DType::kBF16, seed);
  Tensor w = randn({n, k}, DType::kBF16, seed + 1);
  Tensor bias = randn({n}, DType::kBF16, seed + 2);
  for (DType dt : {DType::kBF16, DType::kFP32}) {
    Tensor full = Tensor::empty({m, n}, dt);
    full.fill_nan_();
    ops::gemm(x, w, bias, full);
    // Uneven column partitions, as the locality layer cuts them.
    Tensor parts = Tensor::empty({m, n}, dt);
    parts.fill_nan_();
    const int64_t cuts[] = {0, 1, 6, 17, 29};
    for (int p = 0; p + 1 < 5; ++p) {
      const int64_t n0 = cuts[p], n1 = cuts[p + 1];
      Tensor shard = w.slice(0, n0, n1).clone();
      ops::gemm(x, shard, bias.slice(0, n0, n1).clone(), parts.slice(1, n0, n1));
    }
    EXPECT_TRUE(bitwise_equal(full, parts));
    // Row subsets (a different M, so a different tiling) give the same rows.
    for (int64_t r0 : {0, 5, 12}) {
      Tensor rows = Tensor::empty({1, n}, dt);
      ops::gemm(x.slice(0, r0, r0 + 1), w, bias, rows);
      EXPECT_TRUE(bitwise_equal(rows, full.slice(0, r0, r0 + 1))) << "row " << r0;
    }
    Tensor some = Tensor::empty({4, n}, dt);
    ops::gemm(x.slice(0, 3, 7), w, bias, some);
    EXPECT_TRUE(bitwise_equal(some, full.slice(0, 3, 7)));
  }
}

TEST(Gemm, ThreadCountDoesNotChangeBits) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 37, n = 45, k = 300;
  Tensor x = randn({m, k}, DType::kBF16, seed);
  Tensor w = randn({n, k}, DType::kBF16, seed + 1);
  cpu::ThreadPool one(1), three(3);
  Tensor y1 = Tensor::empty({m, n}, DType::kFP32), y3 = Tensor::empty({m, n}, DType::kFP32);
  y1.fill_nan_();
  y3.fill_nan_();
  ops::gemm(x, w, Tensor(), y1, Stream::cpu(&one));
  ops::gemm(x, w, Tensor(), y3, Stream::cpu(&three));
  EXPECT_TRUE(bitwise_equal(y1, y3));
  Tensor s1 = Tensor::empty({m, n / 2}, DType::kBF16), s3 = Tensor::empty({m, n / 2}, DType::kBF16);
  Tensor wgu = randn({n / 2 * 2, k}, DType::kBF16, seed + 3);
  ops::gemm_swiglu(x, wgu, s1, Stream::cpu(&one));
  ops::gemm_swiglu(x, wgu, s3, Stream::cpu(&three));
  EXPECT_TRUE(bitwise_equal(s1, s3));
}

TEST(Gemm, OutputMayBeAnotherColumnSliceOfTheInputsBuffer) {
  // x = columns [0, 40) and y = columns [40, 49) of one [5, 49] buffer: disjoint, so allowed.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Tensor buf = randn({5, 49}, DType::kBF16, seed);
  Tensor w = randn({9, 40}, DType::kBF16, seed + 1);
  Tensor x = buf.slice(1, 0, 40);
  std::vector<double> ref = ref_gemm(x.clone(), w, Tensor());
  Tensor x_before = x.clone();
  ops::gemm(x, w, Tensor(), buf.slice(1, 40, 49));
  EXPECT_LT(rel_error(buf.slice(1, 40, 49), ref), bf16_gemm_tolerance(40));
  EXPECT_TRUE(bitwise_equal(x, x_before));
}

TEST(Gemm, ZeroKGivesTheBias) {
  Tensor x = Tensor::empty({2, 0}, DType::kBF16);
  Tensor w = Tensor::empty({3, 0}, DType::kBF16);
  Tensor bias = randn({3}, DType::kFP32, fresh_seed());
  Tensor y = Tensor::empty({2, 3}, DType::kFP32);
  y.fill_nan_();
  ops::gemm(x, w, bias, y);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(get(y, i), get(bias, i % 3));
}

TEST(Gemm, RejectsBadOperandsNamingThem) {
  Tensor x = Tensor::zeros({4, 60}, DType::kBF16);
  Tensor w = Tensor::zeros({8, 64}, DType::kBF16);
  Tensor y = Tensor::empty({4, 8}, DType::kBF16);
  EXPECT_NE(error_text([&] { ops::gemm(x, w, Tensor(), y); }).find("gemm: w has K=64 but x has K=60"), std::string::npos);
  Tensor wf = Tensor::zeros({8, 60}, DType::kFP32);
  EXPECT_NE(error_text([&] { ops::gemm(x, wf, Tensor(), y); }).find("gemm: w must be bf16"), std::string::npos);
  Tensor w60 = Tensor::zeros({8, 60}, DType::kBF16);
  Tensor ybad = Tensor::empty({4, 7}, DType::kBF16);
  EXPECT_NE(error_text([&] { ops::gemm(x, w60, Tensor(), ybad); }).find("y has shape [4, 7] but the product is [4, 8]"),
            std::string::npos);
  Tensor bias = Tensor::zeros({5}, DType::kBF16);
  EXPECT_NE(error_text([&] { ops::gemm(x, w60, bias, y); }).find("bias has 5 elements"), std::string::npos);
  Tensor xt = Tensor::zeros({60, 4}, DType::kBF16).transpose(0, 1);
  EXPECT_NE(error_text([&] { ops::gemm(xt, w60, Tensor(), y); }).find("x needs unit column stride"), std::string::npos);
  Tensor big = Tensor::zeros({4, 68}, DType::kBF16);
  EXPECT_NE(error_text([&] { ops::gemm(big.slice(1, 0, 60), w60, Tensor(), big.slice(1, 56, 64)); }).find("overlaps"),
            std::string::npos);
  Tensor odd = Tensor::zeros({7, 60}, DType::kBF16);
  EXPECT_NE(error_text([&] { ops::gemm_swiglu(x, odd, y); }).find("w_gate_up must hold gate and up rows"),
            std::string::npos);
  EXPECT_NE(error_text([&] { ops::gemm(x, Tensor(), Tensor(), y); }).find("gemm: w is an undefined tensor"),
            std::string::npos);
}

std::vector<double> ref_swiglu(const Tensor& x, const Tensor& wgu) {
  const int64_t m = x.size(0), inter = wgu.size(0) / 2;
  std::vector<double> gu = ref_gemm(x, wgu, Tensor());
  std::vector<double> out(static_cast<size_t>(m * inter));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < inter; ++c)
      out[i * inter + c] = silu_d(gu[i * 2 * inter + c]) * gu[i * 2 * inter + inter + c];
  return out;
}

TEST(GemmSwiglu, MatchesFp64AndEqualsUnfusedFromFp32) {
  for (Shape3 s : {Shape3{1, 5, 24}, Shape3{7, 12, 131}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "M=" << s.m << " I=" << s.n << " K=" << s.k << " seed=" << seed);
    Tensor x = randn({s.m, s.k}, DType::kBF16, seed);
    Tensor wgu = randn({2 * s.n, s.k}, DType::kBF16, seed + 1, 0.2);
    Tensor y = Tensor::empty({s.m, s.n}, DType::kBF16);
    y.fill_nan_();
    ops::gemm_swiglu(x, wgu, y);
    EXPECT_LT(rel_error(y, ref_swiglu(x, wgu)), bf16_gemm_tolerance(s.k));
    // The fused op rounds once from the fp32 accumulators: the same as an fp32 GEMM + swiglu.
    Tensor gu = Tensor::empty({s.m, 2 * s.n}, DType::kFP32);
    ops::gemm(x, wgu, Tensor(), gu);
    Tensor y2 = Tensor::empty({s.m, s.n}, DType::kBF16);
    y2.fill_nan_();
    ops::swiglu(gu, y2);
    EXPECT_TRUE(bitwise_equal(y, y2));
  }
}

TEST(GemmSwiglu, PartitionShardsAreBitIdentical) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 5, inter = 19, k = 77;
  Tensor x = randn({m, k}, DType::kBF16, seed);
  Tensor wgu = randn({2 * inter, k}, DType::kBF16, seed + 1, 0.3);
  Tensor full = Tensor::empty({m, inter}, DType::kBF16);
  ops::gemm_swiglu(x, wgu, full);
  Tensor parts = Tensor::empty({m, inter}, DType::kBF16);
  parts.fill_nan_();
  const int64_t cuts[] = {0, 8, 9, 19};
  for (int p = 0; p < 3; ++p) {
    const int64_t n0 = cuts[p], n1 = cuts[p + 1], w = n1 - n0;
    Tensor shard = Tensor::empty({2 * w, k}, DType::kBF16);  // [gate rows p; up rows p]
    shard.slice(0, 0, w).copy_(wgu.slice(0, n0, n1));
    shard.slice(0, w, 2 * w).copy_(wgu.slice(0, inter + n0, inter + n1));
    ops::gemm_swiglu(x, shard, parts.slice(1, n0, n1));
  }
  EXPECT_TRUE(bitwise_equal(full, parts));
}

TEST(Swiglu, MatchesFp64ForBf16Input) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 4, inter = 33;
  Tensor gu = randn({m, 2 * inter}, DType::kBF16, seed, 3.0);
  Tensor y = Tensor::empty({m, inter}, DType::kFP32);
  y.fill_nan_();
  ops::swiglu(gu, y);
  std::vector<double> g = testing::to_doubles(gu), ref(static_cast<size_t>(m * inter));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < inter; ++c) ref[i * inter + c] = silu_d(g[i * 2 * inter + c]) * g[i * 2 * inter + inter + c];
  EXPECT_LT(rel_error(y, ref), 1e-6);  // fp32 exp and two fp32 roundings
}

}  // namespace
}  // namespace locus
