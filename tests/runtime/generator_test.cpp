#include "runtime/generator.h"

#include <gtest/gtest.h>

#include "models/model_test_util.h"

namespace locus::testing {
namespace {

struct GenFixture {
  runtime::LoadedModel lm = load_model(tiny_model_dir(false), 0);
  runtime::KvCacheManager kv{lm.config, lm.device, {64 << 20, "test"}, 4, 256};
};

// The loop itself: prefill, argmax, feed the token back, one forward per step. Replayed by hand
// with the model's forward (same paths, so the tokens must be identical). How decode logits
// relate to a full prefill is DeepseekV3Model.IncrementalDecodeMatchesFullPrefill's job.
TEST(Generator, GreedyMatchesAHandWrittenDecodeLoop) {
  GenFixture f;
  const int64_t V = f.lm.config.vocab_size;
  const auto prompt = random_ids(4, V, fresh_seed());
  runtime::Generator g(*f.lm.model, f.kv, {});
  runtime::GenerationRequest r{prompt, 5, {}};
  runtime::GenerationStats st;
  auto res = g.generate({r}, {}, &st);
  ASSERT_EQ(res[0].tokens.size(), 5u);
  EXPECT_EQ(res[0].finish_reason, "length");
  EXPECT_EQ(st.prompt_tokens, 4);
  EXPECT_EQ(st.decode_tokens, 4);
  EXPECT_EQ(st.decode_steps, 4);
  EXPECT_EQ(f.kv.live_sequences(), 0);  // released

  auto cache = f.lm.model->new_cache(16);
  std::vector<int32_t> expect;
  Tensor l = f.lm.model->forward({{prompt, &cache}});
  for (int i = 0; i < 5; ++i) {
    expect.push_back(runtime::argmax(l.data<float>(), V));
    if (i < 4) l = f.lm.model->forward({{{expect.back()}, &cache}});
  }
  EXPECT_EQ(res[0].tokens, expect);
  EXPECT_EQ(cache.length(), 8);  // 4 prompt + 4 fed-back tokens (the last one is never fed)
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

  // ignore_eos: the same tokens as the free run, all six, past the pretend eos.
  runtime::GenerationRequest past{prompt, 6, {}};
  past.ignore_eos = true;
  auto full = g.generate({past});
  EXPECT_EQ(full[0].finish_reason, "length");
  EXPECT_EQ(full[0].tokens, free_run[0].tokens);
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
