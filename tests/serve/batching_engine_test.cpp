#include "serve/batching_engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "models/model_test_util.h"
#include "runtime/decode_graphs.h"
#include "runtime/generator.h"

namespace locus::testing {
namespace {

struct EngineFixture {
  runtime::LoadedModel lm = load_model(tiny_model_dir(false), 0);
  runtime::KvCacheManager kv{lm.config, lm.device, {64 << 20, "test"}, 4, 256};
  int64_t vocab() const { return lm.config.vocab_size; }
  // The request run alone by the Generator (sequence 0: its own seed).
  std::vector<int32_t> alone(const runtime::GenerationRequest& r) {
    runtime::Generator g(*lm.model, kv, {});
    return g.generate({r})[0].tokens;
  }
};

// Blocks until `count` reaches n (the worker thread advances it).
void wait_for(const std::atomic<int>& count, int n) {
  while (count.load() < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// Requests that wait together start together: the result is the Generator's for the same batch
// (sequence i there samples with seed + i, here each with its own seed), every token streamed;
// a request the KV cache rejects fails alone, naming why, and the others complete. With decode
// graphs (runtime/decode_graphs.h; on the CPU the recorded step run again) the tokens are the same.
void check_waiting_requests_start_as_one_batch(bool with_graphs) {
  SCOPED_TRACE(with_graphs ? "decode graphs" : "eager");
  EngineFixture f;
  runtime::DecodeGraphs graphs(*f.lm.model);
  std::vector<runtime::GenerationRequest> reqs = {
      {random_ids(3, f.vocab(), fresh_seed()), 5, {}},
      {random_ids(5, f.vocab(), fresh_seed()), 4, {0.9, 20, 0.95, 11}},
      {random_ids(2, f.vocab(), fresh_seed()), 100000, {}},  // prompt + max new tokens > max_seq_len 256
      {random_ids(4, f.vocab(), fresh_seed()), 6, {1.0, 0, 1.0, 3}},
  };
  std::vector<runtime::GenerationRequest> as_batch = {reqs[0], reqs[1], reqs[3]};
  for (size_t i = 0; i < as_batch.size(); ++i) as_batch[i].sampling.seed -= i;
  const auto expect = runtime::Generator(*f.lm.model, f.kv, {}).generate(as_batch);

  std::vector<std::vector<int32_t>> streamed(reqs.size());
  {
    serve::BatchingEngine engine(*f.lm.model, f.kv, {}, 4, with_graphs ? &graphs : nullptr);
    // A one-token request holds the worker inside its only step until the others are queued.
    std::atomic<bool> release{false};
    std::atomic<int> gate_started{0};
    auto gate = engine.submit({{random_ids(2, f.vocab(), fresh_seed()), 1, {}}, [&](int32_t) {
                                 ++gate_started;
                                 while (!release.load()) std::this_thread::yield();
                               }});
    wait_for(gate_started, 1);
    std::vector<std::future<runtime::GenerationResult>> futures;
    for (size_t i = 0; i < reqs.size(); ++i)
      futures.push_back(engine.submit({reqs[i], [&streamed, i](int32_t id) { streamed[i].push_back(id); }}));
    release = true;
    gate.get();
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
      EXPECT_EQ(r.tokens, expect[k++].tokens) << "request " << i;
      EXPECT_EQ(streamed[i], r.tokens) << "request " << i;
    }
    EXPECT_EQ(engine.max_batch_seen(), 3);
  }
  EXPECT_EQ(f.kv.live_sequences(), 0);
  if (with_graphs) EXPECT_GT(graphs.stats().replays, 0);
}

TEST(BatchingEngine, WaitingRequestsStartAsOneBatchAndABadOneFailsAlone) {
  check_waiting_requests_start_as_one_batch(false);
  check_waiting_requests_start_as_one_batch(true);
}

// A request that arrives while another is decoding joins the running batch (its prefill next to
// the other's decode step) and leaves when it is done, before the long one. (Tokens sampled in a
// shared step need not match a solo run bit for bit: the batch changes the kernels' shapes, e.g.
// which tokens meet in an expert's GEMM. Up to the join they must.)
TEST(BatchingEngine, RequestsJoinAndLeaveARunningBatch) {
  EngineFixture f;
  const runtime::GenerationRequest long_req{random_ids(4, f.vocab(), fresh_seed()), 40, {0.8, 0, 1.0, 5}};
  const runtime::GenerationRequest short_req{random_ids(7, f.vocab(), fresh_seed()), 3, {}};
  const auto long_alone = f.alone(long_req);
  serve::BatchingEngine engine(*f.lm.model, f.kv, {}, 4);
  std::vector<int32_t> long_streamed;
  std::atomic<int> long_tokens{0};
  std::atomic<bool> short_queued{false};
  auto long_done = engine.submit({long_req, [&](int32_t id) {
                                    long_streamed.push_back(id);
                                    // The worker waits inside the long request's second step until
                                    // the short one is queued: it joins at the third.
                                    if (++long_tokens == 2)
                                      while (!short_queued.load()) std::this_thread::yield();
                                  }});
  wait_for(long_tokens, 2);  // the long request is decoding
  const int before_join = long_tokens.load();
  auto short_done = engine.submit({short_req, {}});
  short_queued = true;
  const auto short_result = short_done.get();
  EXPECT_LT(long_tokens.load(), 40) << "the short request waited for the long one";
  EXPECT_EQ(short_result.tokens.size(), 3u);
  EXPECT_EQ(short_result.finish_reason, "length");
  const auto long_result = long_done.get();
  ASSERT_EQ(long_result.tokens.size(), 40u);
  EXPECT_EQ(long_streamed, long_result.tokens);
  EXPECT_TRUE(std::equal(long_alone.begin(), long_alone.begin() + before_join, long_result.tokens.begin()));
  EXPECT_EQ(engine.max_batch_seen(), 2);
  EXPECT_LT(engine.steps(), 40 + 3);  // they shared steps
  EXPECT_EQ(f.kv.live_sequences(), 0);
}

// A request whose cancelled() turns true leaves the batch after that step with the tokens it
// has (finish_reason "cancelled", cache released); the others go on.
TEST(BatchingEngine, CancelledRequestsEndAtTheNextStep) {
  EngineFixture f;
  serve::BatchingEngine engine(*f.lm.model, f.kv, {}, 4);
  std::atomic<int> seen{0};
  auto other = engine.submit({{random_ids(3, f.vocab(), fresh_seed()), 10, {}}, {}, {}});
  auto cancelled = engine.submit({{random_ids(4, f.vocab(), fresh_seed()), 50, {}},
                                  [&](int32_t) { ++seen; },
                                  [&] { return seen.load() >= 3; }});
  const auto r = cancelled.get();
  EXPECT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_EQ(other.get().tokens.size(), 10u);
  EXPECT_EQ(f.kv.live_sequences(), 0);
}

// More requests than the KV cache holds at once: the ones that do not fit wait for others to end
// (in order), and all complete.
TEST(BatchingEngine, RequestsWaitForKvCacheRoom) {
  EngineFixture f;
  runtime::KvCacheManager small{f.lm.config, f.lm.device, {64 << 20, "test"}, 2, 256};  // 2 sequences
  serve::BatchingEngine engine(*f.lm.model, small, {}, 8);
  std::vector<std::future<runtime::GenerationResult>> done;
  for (int i = 0; i < 5; ++i) done.push_back(engine.submit({{random_ids(3 + i, f.vocab(), fresh_seed()), 4 + i, {}}, {}, {}}));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(done[i].get().tokens.size(), static_cast<size_t>(4 + i)) << "request " << i;
  EXPECT_LE(engine.max_batch_seen(), 2);
  EXPECT_EQ(small.live_sequences(), 0);
}

// A request the model rejects at its first forward (a token id outside the vocabulary) fails
// alone; the request it was batched with goes on to the same tokens as alone. With decode graphs
// and the lookahead the greedy request's steps chain on the device, so the bad request
// arrives beside a step already launched and takes its (failing) prefill in the step after: it
// must still fail alone.
void check_a_rejected_request_fails_alone(bool with_graphs) {
  SCOPED_TRACE(with_graphs ? "decode graphs" : "eager");
  EngineFixture f;
  runtime::DecodeGraphs graphs(*f.lm.model);
  const runtime::GenerationRequest good{random_ids(5, f.vocab(), fresh_seed()), 12, {}};
  const auto good_alone = f.alone(good);
  serve::BatchingEngine engine(*f.lm.model, f.kv, {}, 4, with_graphs ? &graphs : nullptr, /*lookahead=*/with_graphs);
  std::atomic<int> good_tokens{0};
  auto good_done = engine.submit({good, [&](int32_t) { ++good_tokens; }});
  wait_for(good_tokens, 3);
  runtime::GenerationRequest bad{{1, static_cast<int32_t>(f.vocab() + 5)}, 4, {}};
  try {
    engine.submit({bad, {}}).get();
    ADD_FAILURE() << "the bad request succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab"), std::string::npos) << e.what();
  }
  EXPECT_EQ(good_done.get().tokens, good_alone);
  EXPECT_EQ(f.kv.live_sequences(), 0);
  if (with_graphs) EXPECT_GT(graphs.stats().chained, 0);
}

TEST(BatchingEngine, ARequestTheModelRejectsFailsAlone) {
  check_a_rejected_request_fails_alone(false);
  check_a_rejected_request_fails_alone(true);
}

// With decode graphs and the lookahead: a greedy request joins a running greedy one, a
// third is cancelled mid-way; each ends with its own token count and every cache comes back.
TEST(BatchingEngine, RequestsComeAndGoBesideLookaheadSteps) {
  EngineFixture f;
  runtime::DecodeGraphs graphs(*f.lm.model);
  serve::BatchingEngine engine(*f.lm.model, f.kv, {}, 4, &graphs, /*lookahead=*/true);
  std::atomic<int> first_tokens{0}, cancelled_tokens{0};
  auto first = engine.submit({{random_ids(4, f.vocab(), fresh_seed()), 30, {}}, [&](int32_t) { ++first_tokens; }});
  wait_for(first_tokens, 4);
  auto joiner = engine.submit({{random_ids(6, f.vocab(), fresh_seed()), 9, {}}, {}});
  auto cancelled = engine.submit({{random_ids(3, f.vocab(), fresh_seed()), 40, {}},
                                  [&](int32_t) { ++cancelled_tokens; },
                                  [&] { return cancelled_tokens.load() >= 5; }});
  const auto c = cancelled.get();
  EXPECT_EQ(c.finish_reason, "cancelled");
  EXPECT_EQ(c.tokens.size(), 5u);
  EXPECT_EQ(joiner.get().tokens.size(), 9u);
  EXPECT_EQ(first.get().tokens.size(), 30u);
  EXPECT_EQ(f.kv.live_sequences(), 0);
  EXPECT_GT(graphs.stats().chained, 0);
}

}  // namespace
}  // namespace locus::testing
