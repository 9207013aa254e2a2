// RMSNorm and Embedding modules: results against fp64, the lifecycle (never partitioned, reload in
// place with validation).
#include <gtest/gtest.h>

#include "module_test_util.h"
#include "modules/rmsnorm.h"

namespace locus::testing {
namespace {

TEST(RmsNormModuleTest, MatchesFp64AndReloadsInPlace) {
  const uint64_t seed = fresh_seed();
  const int64_t M = 4, H = 32;
  modules::RMSNorm norm(make_ld(2).ctx("model.norm"), H, 1e-6f);
  EXPECT_EQ(norm.missing_pieces(), std::vector<std::string>{"weight"});
  EXPECT_THROW(norm.load("weight", randn({H + 1}, DType::kBF16, seed)), Error);
  Tensor w = randn({H}, DType::kBF16, seed), x = randn({M, H}, DType::kBF16, seed + 1);
  norm.load("weight", w);
  norm.localize();
  EXPECT_EQ(norm.state(), modules::LifecycleState::kLocalized);
  EXPECT_EQ(norm.memory().domain_bytes(-1), H * 2);
  Tensor y = Tensor::empty({M, H}, DType::kFP32);
  y.fill_nan_();
  norm.forward(x, y);
  std::vector<double> ref;
  for (int64_t i = 0; i < M; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < H; ++j) ss += get(x, i * H + j) * get(x, i * H + j);
    for (int64_t j = 0; j < H; ++j) ref.push_back(get(x, i * H + j) / std::sqrt(ss / H + 1e-6) * get(w, j));
  }
  EXPECT_LT(rel_error(y, ref), 1e-5);
  const void* p = norm.weight().data_ptr();
  Tensor w2 = randn({H}, DType::kBF16, seed + 2);
  EXPECT_THROW(norm.reload({{"weight", randn({H}, DType::kFP32, seed)}}), Error);  // dtype changes
  EXPECT_THROW(norm.reload({{"bias", w2}}), Error);
  norm.reload({{"weight", w2}});
  EXPECT_EQ(norm.weight().data_ptr(), p);
  EXPECT_TRUE(bitwise_equal(norm.weight(), w2));
}

TEST(EmbeddingModuleTest, LooksUpRowsAndReloadsInPlace) {
  const uint64_t seed = fresh_seed();
  modules::Embedding emb(make_ld(0).ctx("model.embed_tokens"), 10, 8);
  Tensor table = randn({10, 8}, DType::kBF16, seed);
  emb.load("weight", table);
  emb.transform();
  Tensor ids = Tensor::empty({3}, DType::kI32);
  const int32_t v[3] = {7, 0, 7};
  std::copy(v, v + 3, ids.data<int32_t>());
  Tensor y = Tensor::empty({3, 8}, DType::kBF16);
  y.fill_nan_();
  emb.forward(ids, y);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bitwise_equal(y.slice(0, i, i + 1), table.slice(0, v[i], v[i] + 1)));
  EXPECT_THROW(emb.reload({{"weight", randn({10, 9}, DType::kBF16, seed)}}), Error);
  const void* p = emb.weight().data_ptr();
  emb.reload({{"weight", randn({10, 8}, DType::kBF16, seed + 1)}});
  EXPECT_EQ(emb.weight().data_ptr(), p);
}

}  // namespace
}  // namespace locus::testing
