#include "runtime/generator.h"

#include <gtest/gtest.h>

#include "models/model_test_util.h"

namespace locus::testing {
namespace {

struct GenFixture {
  runtime::LoadedModel lm = load_model(tiny_model_dir(false), 0);
  runtime::KvCacheManager kv{lm.config, lm.device, {64 << 20, "test"}, 4, 256};
};

TEST(Generator, GreedyMatchesArgmaxOfRepeatedFullPrefills) {
  GenFixture f;
  const auto prompt = random_ids(4, f.lm.config.vocab_size, fresh_seed());
  runtime::Generator g(*f.lm.model, f.kv, {});
  runtime::GenerationRequest r{prompt, 5, {}};
  runtime::GenerationStats st;
  auto res = g.generate({r}, {}, &st);
  ASSERT_EQ(res[0].tokens.size(), 5u);
  EXPECT_EQ(res[0].finish_reason, "length");
  EXPECT_EQ(st.prompt_tokens, 4);
  EXPECT_EQ(st.decode_tokens, 4);
  // Independent check: re-run the whole growing sequence each step (prefill path) and take the argmax.
  std::vector<int32_t> seq = prompt;
  const int64_t V = f.lm.config.vocab_size;
  for (size_t i = 0; i < 5; ++i) {
    Tensor l = prefill_logits(*f.lm.model, seq, modules::MlaPath::kPrefill);
    const int32_t t = runtime::argmax(l.data<float>() + (l.size(0) - 1) * V, V);
    // The decode steps use the absorbed attention; a near-tie could flip, so compare the logit
    // margin: the generated token must be (within BF16 rounding) as good as the argmax.
    const float* row = l.data<float>() + (l.size(0) - 1) * V;
    EXPECT_LE(row[t] - row[res[0].tokens[i]], 2e-2f * std::fabs(row[t]) + 1e-3f) << "step " << i;
    seq.push_back(res[0].tokens[i]);
  }
  EXPECT_EQ(f.kv.live_sequences(), 0);  // released
}

TEST(Generator, SameSeedSameTokensAndBatchMatchesAlone) {
  GenFixture f;
  const int64_t V = f.lm.config.vocab_size;
  const auto p0 = random_ids(3, V, fresh_seed()), p1 = random_ids(6, V, fresh_seed());
  runtime::SamplingParams sp{1.0, 20, 0.95, 77};
  runtime::Generator g(*f.lm.model, f.kv, {});
  auto a = g.generate({{p0, 6, sp}, {p1, 4, sp}});
  auto b = g.generate({{p0, 6, sp}, {p1, 4, sp}});
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  EXPECT_EQ(a[1].tokens, b[1].tokens);
  EXPECT_EQ(a[1].tokens.size(), 4u);
  // Sequence 0 alone samples with the same seed as in the batch (seed + index 0).
  auto alone = g.generate({{p0, 6, sp}});
  EXPECT_EQ(alone[0].tokens, a[0].tokens);
}

TEST(Generator, StopsAtEosAndStreamsEveryToken) {
  GenFixture f;
  const auto prompt = random_ids(4, f.lm.config.vocab_size, fresh_seed());
  runtime::Generator probe(*f.lm.model, f.kv, {});
  auto free_run = probe.generate({{prompt, 6, {}}});
  const int32_t stop = free_run[0].tokens[2];  // pretend the third token is eos
  runtime::Generator g(*f.lm.model, f.kv, {stop});
  std::vector<int32_t> streamed;
  auto res = g.generate({{prompt, 6, {}}}, [&](size_t i, int32_t t) {
    EXPECT_EQ(i, 0u);
    streamed.push_back(t);
  });
  EXPECT_EQ(res[0].finish_reason, "eos");
  EXPECT_EQ(res[0].tokens.back(), stop);
  EXPECT_LE(res[0].tokens.size(), 3u);
  EXPECT_EQ(streamed, res[0].tokens);
}

TEST(Generator, BudgetAndRequestErrorsComeBeforeComputeAndReleaseCaches) {
  GenFixture f;
  runtime::KvCacheManager small(f.lm.config, f.lm.device, {100 * models::DeepseekV3Cache::bytes_per_token(f.lm.config), "kv_cache_budget_bytes=small"}, 4, 256);
  runtime::Generator g(*f.lm.model, small, {});
  expect_error([&] { g.generate({{{1, 2, 3}, 60, {}}, {{4, 5}, 60, {}}}); }, {"budget exceeded"});
  EXPECT_EQ(small.live_sequences(), 0);
  expect_error([&] { g.generate({}); }, {"no prompts"});
  expect_error([&] { g.generate({{{}, 4, {}}}); }, {"prompt 0"});
  expect_error([&] { g.generate({{{1}, 0, {}}}); }, {"max_new_tokens"});
  expect_error([&] { g.generate({{{1}, 4, {-1.0}}}); }, {"temperature"});
  EXPECT_EQ(small.live_sequences(), 0);
}

}  // namespace
}  // namespace locus::testing
