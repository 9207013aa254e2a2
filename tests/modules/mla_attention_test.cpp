// ops::mla_attention (the CPU kernel) against an fp64 causal attention, for per-head and shared
// (one-head) keys/values, a cached prefix (q_start > 0), fp32 and bf16 outputs, and bad shapes.
#include "ops/attention.h"

#include <gtest/gtest.h>

#include "mla_attention_reference.h"
#include "module_test_util.h"

namespace locus::testing {
namespace {

TEST(MlaAttentionTest, MatchesFp64ForPerHeadAndSharedKeys) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t T = 5, H = 3, Da = 16, Db = 8, Dv = 12, q_start = 4, S = q_start + T;
  for (int64_t kv_heads : {H, int64_t{1}}) {
    SCOPED_TRACE(kv_heads);
    Tensor qa = randn({T, H, Da}, DType::kBF16, seed), qb = randn({T, H, Db}, DType::kBF16, seed + 1);
    Tensor ka = randn({S, kv_heads, Da}, DType::kBF16, seed + 2), kb = randn({S, 1, Db}, DType::kBF16, seed + 3);
    Tensor v = randn({S, kv_heads, Dv}, DType::kBF16, seed + 4);
    const float scale = 0.3f;
    const auto ref = ref_attention(qa, qb, ka, kb, v, scale, q_start);
    for (DType out_t : {DType::kFP32, DType::kBF16}) {
      Tensor out = Tensor::empty({T, H, Dv}, out_t);
      out.fill_nan_();
      ops::mla_attention(qa, qb, ka, kb, v, out, scale, q_start);
      EXPECT_LT(rel_error(out, ref), attention_tolerance(out_t, Da + Db, S));
    }
  }
}

TEST(MlaAttentionTest, StridedViewsAreRead) {
  const uint64_t seed = fresh_seed();
  const int64_t T = 2, H = 2, D = 8, S = 2;
  Tensor big = randn({S, 1, 3 * D}, DType::kBF16, seed);  // keys and values as column slices of one buffer
  Tensor q = randn({T, H, 2 * D}, DType::kBF16, seed + 1);
  Tensor ka = big.slice(2, 0, D), kb = big.slice(2, D, 2 * D), v = big.slice(2, 2 * D, 3 * D);
  Tensor out = Tensor::empty({T, H, D}, DType::kFP32);
  out.fill_nan_();
  ops::mla_attention(q.slice(2, 0, D), q.slice(2, D, 2 * D), ka, kb, v, out, 0.5f, 0);
  EXPECT_LT(rel_error(out, ref_attention(q.slice(2, 0, D).clone(), q.slice(2, D, 2 * D).clone(), ka.clone(), kb.clone(),
                                         v.clone(), 0.5, 0)),
            1e-5);
}

TEST(MlaAttentionTest, BadShapesAreErrors) {
  Tensor q = Tensor::zeros({2, 2, 8}, DType::kBF16), k = Tensor::zeros({3, 2, 8}, DType::kBF16);
  Tensor out = Tensor::empty({2, 2, 8}, DType::kFP32);
  EXPECT_THROW(ops::mla_attention(q, q, k, k, k, out, 1.f, 2), Error);  // 3 keys < 2 + 2
  EXPECT_THROW(ops::mla_attention(q, q, Tensor::zeros({3, 3, 8}, DType::kBF16), k, k, out, 1.f, 0), Error);  // 3 heads
  EXPECT_THROW(ops::mla_attention(q, q, k, k, k, Tensor::empty({2, 2, 4}, DType::kFP32), 1.f, 0), Error);
  EXPECT_THROW(ops::mla_attention(q, q, k, k, k, q, 1.f, 0), Error);  // output overlaps an input
  EXPECT_THROW(ops::mla_attention(q, q, k, k, Tensor::zeros({3, 2, 8}, DType::kI32), out, 1.f, 0), Error);
}

}  // namespace
}  // namespace locus::testing
