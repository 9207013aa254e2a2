#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"

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
