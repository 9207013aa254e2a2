// CPU batched GEMM against fp64, with strided/transposed operand views, and bitwise checks.
#include "ops/bmm.h"

#include <gtest/gtest.h>

#include "backends/cpu/thread_pool.h"
#include "test_util.h"

namespace locus {
namespace {

using testing::bf16_gemm_tolerance;
using testing::bitwise_equal;
using testing::fresh_seed;
using testing::get;
using testing::randn;
using testing::rel_error;

std::vector<double> ref_bmm(const Tensor& a, const Tensor& b) {
  const int64_t batches = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  std::vector<double> out(static_cast<size_t>(batches * m * n));
  for (int64_t h = 0; h < batches; ++h)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk) s += get(a, (h * m + i) * k + kk) * get(b, (h * k + kk) * n + j);
        out[(h * m + i) * n + j] = s;
      }
  return out;
}

TEST(Bmm, TransposedAndRowMajorWeightsMatchFp64AndEachOther) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t heads = 5, tokens = 3, k = 37, n = 19;
  // a: a [T, H, K] activation viewed as [H, T, K] (batch stride K, row stride H*K).
  Tensor act = randn({tokens, heads, k}, DType::kBF16, seed);
  Tensor a = act.transpose(0, 1);
  // b as a transposed view of per-head [N, K] weights (stride(1) == 1) ...
  Tensor w_nk = randn({heads, n, k}, DType::kBF16, seed + 1);
  Tensor b_t = w_nk.transpose(1, 2);
  // ... and the same values stored row-major [H, K, N].
  Tensor b_rm = b_t.clone();
  std::vector<double> ref = ref_bmm(a, b_t);
  Tensor y1 = Tensor::empty({heads, tokens, n}, DType::kBF16), y2 = Tensor::empty({heads, tokens, n}, DType::kBF16);
  y1.fill_nan_();
  y2.fill_nan_();
  ops::bmm(a, b_t, y1);
  ops::bmm(a, b_rm, y2);
  EXPECT_LT(rel_error(y1, ref), bf16_gemm_tolerance(k));
  EXPECT_LT(rel_error(y2, ref), bf16_gemm_tolerance(k));
  EXPECT_TRUE(bitwise_equal(y1, y2));
}

TEST(Bmm, Fp32OutputIntoStridedViewAndHeadSlicesAreBitIdentical) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t heads = 6, m = 4, k = 64, n = 10;
  Tensor a = randn({heads, m, k}, DType::kBF16, seed);
  Tensor b = randn({heads, k, n}, DType::kBF16, seed + 1);
  // y as a [H, M, N] view into a [M, H, N + 3] buffer.
  Tensor buf = Tensor::empty({m, heads, n + 3}, DType::kFP32);
  buf.fill_nan_();
  Tensor poison = buf.clone();
  Tensor y = buf.slice(2, 0, n).transpose(0, 1);
  ops::bmm(a, b, y);
  EXPECT_LT(rel_error(y, ref_bmm(a, b)), testing::fp32_out_gemm_tolerance(k));
  EXPECT_TRUE(bitwise_equal(buf.slice(2, n, n + 3), poison.slice(2, n, n + 3)));
  // Heads split as the locality layer splits them, on pools of different sizes.
  cpu::ThreadPool one(1), three(3);
  Tensor parts = Tensor::empty({heads, m, n}, DType::kFP32);
  parts.fill_nan_();
  ops::bmm(a.slice(0, 0, 2), b.slice(0, 0, 2).clone(), parts.slice(0, 0, 2), Stream::cpu(&one));
  ops::bmm(a.slice(0, 2, 6), b.slice(0, 2, 6).clone(), parts.slice(0, 2, 6), Stream::cpu(&three));
  EXPECT_TRUE(bitwise_equal(parts, y));
}

TEST(Bmm, RejectsMismatchedOperands) {
  Tensor a = Tensor::zeros({2, 3, 8}, DType::kBF16);
  Tensor b = Tensor::zeros({2, 9, 4}, DType::kBF16);
  Tensor y = Tensor::empty({2, 3, 4}, DType::kBF16);
  try {
    ops::bmm(a, b, y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bmm: b has K=9 but a has K=8"), std::string::npos) << e.what();
  }
  Tensor b3 = Tensor::zeros({3, 8, 4}, DType::kBF16);
  EXPECT_THROW(ops::bmm(a, b3, y), Error);
  Tensor bstr = Tensor::zeros({2, 8, 8}, DType::kBF16).slice(2, 0, 4).slice(1, 0, 8);
  Tensor bbad = Tensor::from_blob_strided(bstr.data_ptr(), {2, 8, 4}, {64, 8, 2}, DType::kBF16);
  EXPECT_THROW(ops::bmm(a, bbad, y), Error);
}

}  // namespace
}  // namespace locus
