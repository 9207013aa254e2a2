// ops::mla_attention (the CPU kernel) against an fp64 causal attention, for per-head and shared
// (one-head) keys/values, a cached prefix (q_start > 0), fp32 and bf16 outputs, and bad shapes.
#include "ops/attention.h"

#include <gtest/gtest.h>

#include "module_test_util.h"

namespace locus::testing {
namespace {

std::vector<double> ref_attention(const Tensor& qa, const Tensor& qb, const Tensor& ka, const Tensor& kb, const Tensor& v,
                                  double scale, int64_t q_start) {
  const int64_t T = qa.size(0), H = qa.size(1), Da = qa.size(2), Db = qb.size(2), Dv = v.size(2);
  auto at = [](const Tensor& t, int64_t i, int64_t h, int64_t d) {
    const int64_t hh = t.size(1) == 1 ? 0 : h;
    return get(t, (i * t.size(1) + hh) * t.size(2) + d);
  };
  std::vector<double> out(T * H * Dv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t n = q_start + t + 1;
      std::vector<double> s(n);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t k = 0; k < Da; ++k) d += at(qa, t, h, k) * at(ka, j, h, k);
        for (int64_t k = 0; k < Db; ++k) d += at(qb, t, h, k) * at(kb, j, h, k);
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < Dv; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += s[j] * at(v, j, h, d);
        out[(t * H + h) * Dv + d] = acc / sum;
      }
    }
  return out;
}

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
      // Two fp32 reductions in a row: the dot products over Da + Db and the weighted sum over S keys.
      const double tol = out_t == DType::kFP32 ? fp32_out_gemm_tolerance(Da + Db) + fp32_out_gemm_tolerance(S)
                                               : bf16_gemm_tolerance(S);
      EXPECT_LT(rel_error(out, ref), tol);
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
