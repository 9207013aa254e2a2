#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace locus::runtime {
namespace {

std::vector<double> softmax_ref(const std::vector<float>& logits, double temperature) {
  double mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  for (auto& v : p) v /= sum;
  return p;
}

std::vector<int64_t> histogram(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<int64_t> h(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++h.at(s.sample(logits.data(), static_cast<int64_t>(logits.size())));
  return h;
}

TEST(Sampler, GreedyPicksArgmaxLowerIndexOnTiesAndSkipsNaN) {
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, NAN, 2.9f};
  Sampler s({});
  EXPECT_EQ(s.sample(l.data(), 6), 1);
  std::vector<float> nan_first = {NAN, -5.0f, -4.0f};
  EXPECT_EQ(s.sample(nan_first.data(), 3), 2);
  std::vector<float> all_nan = {NAN, NAN};
  EXPECT_THROW(s.sample(all_nan.data(), 2), Error);
}

// Logits [rows, vocab] with every case argmax() distinguishes: random rows with repeated maxima
// (values on a coarse grid), NaN first, -0 against +0, +inf twice, all -inf.
Tensor special_logits(int64_t vocab, uint64_t seed) {
  const int64_t rows = 8;
  Tensor t = Tensor::empty({rows, vocab}, DType::kFP32);
  float* p = t.data<float>();
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < rows * vocab; ++i) p[i] = static_cast<float>(static_cast<int>(rng() % 64) - 40) * 0.25f;
  float* nan_first = p + 4 * vocab;
  nan_first[0] = NAN;
  nan_first[vocab - 1] = 100.f;
  float* zeros = p + 5 * vocab;
  for (int64_t i = 0; i < vocab; ++i) zeros[i] = -1.f;
  zeros[2] = -0.f;
  zeros[1] = 0.f;
  float* inf = p + 6 * vocab;
  inf[vocab / 2] = inf[vocab / 3] = INFINITY;
  float* neg = p + 7 * vocab;
  for (int64_t i = 0; i < vocab; ++i) neg[i] = -INFINITY;
  return t;
}

TEST(Sampler, ArgmaxRowsIsArgmaxRowByRow) {
  const uint64_t seed = locus::testing::fresh_seed();
  SCOPED_TRACE(seed);
  for (int64_t vocab : {int64_t{4}, int64_t{5}, int64_t{1000}, int64_t{129280}}) {
    SCOPED_TRACE(vocab);
    const Tensor l = special_logits(vocab, seed + vocab);
    const std::vector<int32_t> got = argmax_rows(l);
    ASSERT_EQ(got.size(), static_cast<size_t>(l.size(0)));
    for (int64_t r = 0; r < l.size(0); ++r) EXPECT_EQ(got[r], argmax(l.data<float>() + r * l.size(1), l.size(1))) << r;
  }
  Tensor all_nan = special_logits(16, seed);
  for (int64_t i = 0; i < 16; ++i) all_nan.data<float>()[3 * 16 + i] = NAN;
  EXPECT_THROW(
      try { argmax_rows(all_nan); } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("every one of the 16 logits is NaN"), std::string::npos) << e.what();
        throw;
      },
      Error);
  EXPECT_THROW(argmax_rows(Tensor::empty({2, 3}, DType::kBF16)), Error);
}

TEST(Sampler, TopK1AndTinyTopPAreGreedy) {
  std::vector<float> l = {0.1f, 0.3f, 0.25f, -2.f, 0.29f};
  Sampler k1({.temperature = 1.0, .top_k = 1, .seed = 7});
  Sampler tiny_p({.temperature = 5.0, .top_p = 1e-6, .seed = 7});
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(k1.sample(l.data(), 5), 1);
    EXPECT_EQ(tiny_p.sample(l.data(), 5), 1);
  }
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(i * 1.7));
  SamplingParams p{.temperature = 1.0, .seed = 1234};
  Sampler a(p), b(p);
  p.seed = 99;
  Sampler c(p);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 100; ++i) {
    ta.push_back(a.sample(l.data(), 64));
    tb.push_back(b.sample(l.data(), 64));
    tc.push_back(c.sample(l.data(), 64));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

// With a fixed seed the draws are deterministic, so this bounded check cannot flake; the bound
// (5 standard deviations of a binomial count) would also hold for almost every other seed.
TEST(Sampler, FrequenciesMatchSoftmaxAtTemperature) {
  const std::vector<float> l = {1.0f, 2.0f, 0.0f, -1.0f, 1.5f};
  const double temperature = 0.8;
  const int draws = 40000;
  Sampler s({.temperature = temperature, .seed = 42});
  auto h = histogram(s, l, draws);
  auto p = softmax_ref(l, temperature);
  for (size_t i = 0; i < l.size(); ++i) {
    const double sd = std::sqrt(draws * p[i] * (1 - p[i]));
    EXPECT_NEAR(static_cast<double>(h[i]), draws * p[i], 5 * sd + 1) << "token " << i;
  }
}

TEST(Sampler, TopKKeepsOnlyTheKMostLikelyRenormalized) {
  const std::vector<float> l = {1.0f, 2.0f, 0.0f, -1.0f, 1.5f};
  const int draws = 20000;
  Sampler s({.temperature = 1.0, .top_k = 2, .seed = 5});
  auto h = histogram(s, l, draws);
  EXPECT_EQ(h[0] + h[2] + h[3], 0);
  const double p1 = 1.0 / (1.0 + std::exp(-0.5));  // token 1 vs token 4
  const double sd = std::sqrt(draws * p1 * (1 - p1));
  EXPECT_NEAR(static_cast<double>(h[1]), draws * p1, 5 * sd);
  EXPECT_EQ(h[1] + h[4], draws);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (logits are their logs): top_p 0.75 keeps tokens {0, 1}
  // (0.5 < 0.75 <= 0.8), renormalized to 0.625 / 0.375.
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  const int draws = 20000;
  Sampler s({.temperature = 1.0, .top_p = 0.75, .seed = 11});
  auto h = histogram(s, l, draws);
  EXPECT_EQ(h[2] + h[3], 0);
  const double sd = std::sqrt(draws * 0.625 * 0.375);
  EXPECT_NEAR(static_cast<double>(h[0]), draws * 0.625, 5 * sd);
}

TEST(Sampler, InfiniteLogitsDegenerateToArgmax) {
  std::vector<float> all_neg_inf = {-INFINITY, -INFINITY, -INFINITY};
  std::vector<float> pos_inf = {0.f, INFINITY, 3.f};
  Sampler s({.temperature = 1.0, .seed = 3});
  EXPECT_EQ(s.sample(all_neg_inf.data(), 3), 0);
  EXPECT_EQ(s.sample(pos_inf.data(), 3), 1);
}

TEST(Sampler, BadParamsAndInputsAreErrorsNamingTheField) {
  auto message = [](SamplingParams p) {
    try {
      Sampler s(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({.temperature = -1.0}).find("temperature"), std::string::npos);
  EXPECT_NE(message({.top_k = -3}).find("top_k"), std::string::npos);
  EXPECT_NE(message({.top_p = 0.0}).find("top_p"), std::string::npos);
  EXPECT_NE(message({.top_p = 1.5}).find("top_p"), std::string::npos);
  Sampler s({});
  EXPECT_THROW(s.sample(Tensor::zeros({2, 3}, DType::kFP32)), Error);
  EXPECT_THROW(s.sample(Tensor::zeros({3}, DType::kBF16)), Error);
  Tensor ok = Tensor::zeros({3}, DType::kFP32);
  ok.data<float>()[2] = 1.f;
  EXPECT_EQ(s.sample(ok), 2);
}

}  // namespace
}  // namespace locus::runtime
