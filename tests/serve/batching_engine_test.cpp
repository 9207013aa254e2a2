#include "serve/batching_engine.h"

#include <gtest/gtest.h>

#include "models/model_test_util.h"

namespace locus::testing {
namespace {

struct EngineFixture {
  runtime::LoadedModel lm = load_model(tiny_model_dir(false), 0);
  runtime::KvCacheManager kv{lm.config, lm.device, {64 << 20, "test"}, 4, 256};
  runtime::Generator gen{*lm.model, kv, {}};
};

// Requests submitted together get their own results, the same as each alone (greedy and seeded
// sampling alike: the engine undoes the generator's per-position seed offset), with every token
// streamed; a request the KV cache rejects fails alone, naming why, and the others complete.
TEST(BatchingEngine, EachRequestGetsItsOwnResultAndABadOneFailsAlone) {
  EngineFixture f;
  const int64_t V = f.lm.config.vocab_size;
  std::vector<runtime::GenerationRequest> reqs = {
      {random_ids(3, V, fresh_seed()), 5, {}},
      {random_ids(5, V, fresh_seed()), 4, {0.9, 20, 0.95, 11}},
      {random_ids(2, V, fresh_seed()), 100000, {}},  // prompt + max new tokens > max_seq_len 256
      {random_ids(4, V, fresh_seed()), 6, {1.0, 0, 1.0, 3}},
  };
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : reqs)
    if (r.max_new_tokens < 1000) alone.push_back(f.gen.generate({r})[0].tokens);

  std::vector<std::vector<int32_t>> streamed(reqs.size());
  std::vector<std::future<runtime::GenerationResult>> futures;
  {
    serve::BatchingEngine engine(f.gen, 4);
    for (size_t i = 0; i < reqs.size(); ++i)
      futures.push_back(engine.submit({reqs[i], [&streamed, i](int32_t id) { streamed[i].push_back(id); }}));
    size_t k = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (i == 2) {
        try {
          futures[i].get();
          ADD_FAILURE() << "the oversized request succeeded";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("exceeds"), std::string::npos) << e.what();
        }
        continue;
      }
      const runtime::GenerationResult r = futures[i].get();
      EXPECT_EQ(r.tokens, alone[k++]) << "request " << i;
      EXPECT_EQ(streamed[i], r.tokens) << "request " << i;
    }
  }
  // Without the bad request the good ones run as one batch (or as many as the worker finds
  // waiting): still each its own tokens.
  {
    serve::BatchingEngine engine(f.gen, 4);
    std::vector<std::future<runtime::GenerationResult>> again;
    for (size_t i : {0, 1, 3}) again.push_back(engine.submit({reqs[i], {}}));
    for (size_t k = 0; k < again.size(); ++k) EXPECT_EQ(again[k].get().tokens, alone[k]) << "request " << k;
  }
  EXPECT_EQ(f.kv.live_sequences(), 0);
}

}  // namespace
}  // namespace locus::testing
