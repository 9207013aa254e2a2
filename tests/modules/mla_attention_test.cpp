// ops::mla_attention (the CPU kernel) against an fp64 causal attention, for per-head and shared
// (one-head) keys/values, a cached prefix (q_start > 0), fp32 and bf16 outputs, and bad shapes.
#include "ops/attention.h"

#include <gtest/gtest.h>

#include "mla_attention_reference.h"
#include "module_test_util.h"
#include "runtime/runtime_test_util.h"

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

// mla_attention_batch: each sequence's rows bitwise as one mla_attention call on its own keys
// (q_start = its keys - T), for sequences of different lengths with shared and per-head keys;
// mismatched rows and too few keys are errors naming the sequence.
TEST(MlaAttentionTest, BatchIsOneCallPerSequence) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t T = 2, H = 3, Da = 16, Db = 8, Dv = 12;
  const std::vector<int64_t> lengths = {2, 9, 5};
  const int64_t B = static_cast<int64_t>(lengths.size());
  Tensor qa = randn({B * T, H, Da}, DType::kBF16, seed), qb = randn({B * T, H, Db}, DType::kBF16, seed + 1);
  std::vector<ops::AttentionKeys> keys;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t S = lengths[static_cast<size_t>(i)], heads = i == 1 ? H : 1;
    keys.push_back({randn({S, heads, Da}, DType::kBF16, seed + 10 * i + 2),
                    randn({S, 1, Db}, DType::kBF16, seed + 10 * i + 3),
                    randn({S, heads, Dv}, DType::kBF16, seed + 10 * i + 4)});
  }
  Tensor out = Tensor::empty({B * T, H, Dv}, DType::kFP32);
  out.fill_nan_();
  ops::mla_attention_batch(qa, qb, keys, out, 0.3f);
  for (int64_t i = 0; i < B; ++i) {
    const auto& k = keys[static_cast<size_t>(i)];
    Tensor one = Tensor::empty({T, H, Dv}, DType::kFP32);
    one.fill_nan_();
    ops::mla_attention(qa.slice(0, i * T, (i + 1) * T), qb.slice(0, i * T, (i + 1) * T), k.k_a, k.k_b, k.v, one, 0.3f,
                       k.k_a.size(0) - T);
    EXPECT_TRUE(bitwise_equal(out.slice(0, i * T, (i + 1) * T), one)) << "sequence " << i;
  }
  expect_error([&] { ops::mla_attention_batch(qa.slice(0, 0, 5), qb.slice(0, 0, 5), keys, out.slice(0, 0, 5), 1.f); },
               {"mla_attention_batch", "5 query rows", "3 sequences"});
  keys[2].k_a = keys[2].k_a.slice(0, 0, 1);
  keys[2].k_b = keys[2].k_b.slice(0, 0, 1);
  keys[2].v = keys[2].v.slice(0, 0, 1);
  expect_error([&] { ops::mla_attention_batch(qa, qb, keys, out, 1.f); }, {"sequence 2", "1 keys", "2 query rows"});
  expect_error([&] { ops::mla_attention_batch(qa, qb, {}, out, 1.f); }, {"no sequences"});
}

}  // namespace
}  // namespace locus::testing
