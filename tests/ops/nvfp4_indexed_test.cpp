// NVFP4 products whose rows take their weights by id (a MoE's decode), on the CPU: row t*k + j is
// exactly nvfp4_gemm / nvfp4_gemm_swiglu of token t's row with weight ids[t, j], tokens sharing
// an expert included; bad ids, sets of mixed shapes and wrong outputs are errors that name them.
#include "ops/nvfp4_indexed.h"

#include <gtest/gtest.h>

#include <cstring>

#include "runtime/runtime_test_util.h"
#include "test_util.h"

namespace locus::testing {
namespace {

Tensor ids_tensor(const std::vector<int32_t>& v, int64_t k) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size()) / k, k}, DType::kI32);
  std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(int32_t));
  return t;
}

TEST(Nvfp4Indexed, EachRowIsTheOpWithItsWeight) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t K = 64, N = 32, E = 5, T = 3, k = 2;
  const std::vector<int32_t> chosen = {4, 0, 0, 2, 4, 1};  // tokens 0 and 2 share expert 4, 1 and 0 share 0
  for (const bool swiglu : {false, true}) {
    SCOPED_TRACE(swiglu ? "swiglu" : "plain");
    std::vector<ops::Nvfp4Weight> w;
    for (int64_t e = 0; e < E; ++e)
      w.push_back(ops::nvfp4_quantize(randn({swiglu ? 2 * N : N, K}, DType::kBF16, seed + 10 + e, 0.2)));
    std::vector<const ops::Nvfp4Weight*> ptrs;
    for (const auto& x : w) ptrs.push_back(&x);
    const ops::Nvfp4WeightSet set(ptrs);
    const Tensor x = randn({T, K}, DType::kBF16, seed + 1);
    Tensor y = Tensor::empty({T * k, N}, DType::kFP32);
    y.fill_nan_();
    ops::nvfp4_gemm_indexed(x, ids_tensor(chosen, k), set, y, swiglu);
    for (int64_t i = 0; i < T * k; ++i) {
      const int64_t t = i / k;
      Tensor want = Tensor::empty({1, N}, DType::kFP32);
      swiglu ? ops::nvfp4_gemm_swiglu(x.slice(0, t, t + 1), w[static_cast<size_t>(chosen[i])], want)
             : ops::nvfp4_gemm(x.slice(0, t, t + 1), w[static_cast<size_t>(chosen[i])], Tensor(), want);
      EXPECT_TRUE(bitwise_equal(y.slice(0, i, i + 1), want)) << "row " << i;
    }
  }
}

TEST(Nvfp4Indexed, BadInputsAreNamed) {
  const ops::Nvfp4Weight a = ops::nvfp4_quantize(randn({32, 64}, DType::kBF16, 3, 0.2));
  const ops::Nvfp4Weight other_k = ops::nvfp4_quantize(randn({32, 128}, DType::kBF16, 4, 0.2));
  expect_error([&] { ops::Nvfp4WeightSet s({&a, &other_k}); }, {"Nvfp4WeightSet", "weight 1", "32 x 128"});
  expect_error([&] { ops::Nvfp4WeightSet s({}); }, {"no weights"});
  const ops::Nvfp4WeightSet set({&a, &a});
  const Tensor x = randn({2, 64}, DType::kBF16, 5);
  Tensor y = Tensor::empty({4, 32}, DType::kFP32);
  expect_error([&] { ops::nvfp4_gemm_indexed(x, ids_tensor({0, 1, 2, 0}, 2), set, y, false); },
               {"nvfp4_gemm_indexed", "id 2 of token 1 choice 0", "[0, 2)"});
  expect_error([&] { ops::nvfp4_gemm_indexed(x, ids_tensor({0, 1, 1, 0}, 2), set, y.slice(0, 0, 3), false); },
               {"nvfp4_gemm_indexed", "y"});
  expect_error([&] { ops::nvfp4_gemm_indexed(x, ids_tensor({0, 1}, 2), set, y, false); }, {"ids"});
}

// Two products in one call (a MoE's routed experts and its shared expert as a one-weight set with
// ids of zeros), writing two row ranges of one output: each range is what its product alone gives.
TEST(Nvfp4Indexed, SeveralProductsAreEachTheirOwnCall) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t K = 64, N = 32, T = 2, k = 2;
  std::vector<ops::Nvfp4Weight> w;
  for (int64_t e = 0; e < 4; ++e) w.push_back(ops::nvfp4_quantize(randn({2 * N, K}, DType::kBF16, seed + 10 + e, 0.2)));
  const ops::Nvfp4WeightSet routed({&w[0], &w[1], &w[2]}), shared({&w[3]});
  const Tensor x = randn({T, K}, DType::kBF16, seed + 1);
  const Tensor ids = ids_tensor({2, 0, 1, 2}, k), zeros = ids_tensor({0, 0}, 1);
  Tensor y = Tensor::empty({T * k + T, N}, DType::kBF16);
  y.fill_nan_();
  ops::nvfp4_gemm_indexed({{x, ids, &routed, y.slice(0, 0, T * k)}, {x, zeros, &shared, y.slice(0, T * k, T * k + T)}},
                          /*swiglu=*/true);
  Tensor want_routed = Tensor::empty({T * k, N}, DType::kBF16), want_shared = Tensor::empty({T, N}, DType::kBF16);
  ops::nvfp4_gemm_indexed(x, ids, routed, want_routed, true);
  ops::nvfp4_gemm_indexed(x, zeros, shared, want_shared, true);
  EXPECT_TRUE(bitwise_equal(y.slice(0, 0, T * k), want_routed));
  EXPECT_TRUE(bitwise_equal(y.slice(0, T * k, T * k + T), want_shared));

  // One launch takes one weight shape, one output dtype and outputs at or after the first.
  const ops::Nvfp4Weight narrow = ops::nvfp4_quantize(randn({N, K}, DType::kBF16, seed + 20, 0.2));
  const ops::Nvfp4WeightSet other_shape({&narrow});
  expect_error([&] { ops::nvfp4_gemm_indexed({{x, ids, &routed, y.slice(0, 0, T * k)},
                                              {x, zeros, &other_shape, Tensor::empty({T, N / 2}, DType::kBF16)}}, true); },
               {"nvfp4_gemm_indexed", "one launch takes one shape"});
  expect_error([&] { ops::nvfp4_gemm_indexed({{x, ids, &routed, y.slice(0, T, T + T * k)},
                                              {x, zeros, &shared, y.slice(0, 0, T)}}, true); },
               {"nvfp4_gemm_indexed", "starts before"});
  expect_error([&] { ops::nvfp4_gemm_indexed({{x, ids, &routed, y.slice(0, 0, T * k)},
                                              {x, zeros, &shared, Tensor::empty({T, N}, DType::kFP32)}}, true); },
               {"nvfp4_gemm_indexed", "y"});
  expect_error([&] { ops::nvfp4_gemm_indexed({{x, ids, nullptr, y.slice(0, 0, T * k)}}, true); }, {"no weight set"});
}

}  // namespace
}  // namespace locus::testing
