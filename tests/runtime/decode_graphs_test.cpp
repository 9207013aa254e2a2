// runtime::DecodeGraphs on the CPU, where a "graph" is its step function run again at each replay
// (ops::StepGraph). The tests hold it to the CUDA contract: every input that changes between
// steps (tokens, lengths, which caches) reaches a replay through the tables, so replays give
// bitwise the eager forward's logits and tokens, also when other caches take a key's graph.
#include "runtime/decode_graphs.h"

#include <gtest/gtest.h>

#include "models/model_test_util.h"
#include "runtime/batch_stepper.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"

namespace locus::testing {
namespace {

class DecodeGraphs : public ::testing::Test {
 protected:
  runtime::LoadedModel lm = load_model(tiny_model_dir(false), 0);
  runtime::KvCacheManager kv{lm.config, lm.device, {64 << 20, "test"}, 4, 256};
  models::DeepseekV3ForCausalLM& m = *lm.model;
  const int64_t V = lm.config.vocab_size;
  const uint64_t seed = fresh_seed();  // each test traces it
};

// A cache holding `prompt` (prefilled by the model's eager forward), and a copy of it.
std::pair<models::DeepseekV3Cache, models::DeepseekV3Cache> prefilled_twice(models::DeepseekV3ForCausalLM& m,
                                                                           const std::vector<int32_t>& prompt) {
  auto a = m.new_cache(200), b = m.new_cache(200);
  m.forward({{prompt, &a}});
  m.forward({{prompt, &b}});
  return {std::move(a), std::move(b)};
}

TEST_F(DecodeGraphs, TableForwardIsTheModelsForward) {
  SCOPED_TRACE(seed);
  auto [a, a2] = prefilled_twice(m, random_ids(3, V, seed));
  auto [b, b2] = prefilled_twice(m, random_ids(9, V, seed + 1));
  const std::vector<int32_t> next = random_ids(2, V, seed + 2);
  const Tensor want = m.forward_on_device({{{next[0]}, &a}, {{next[1]}, &b}});

  const int64_t L = lm.config.num_hidden_layers;
  models::DecodeTables t;
  t.ids = Tensor::empty({2}, DType::kI32);
  t.lengths = Tensor::empty({2}, DType::kI32);
  t.kv_rows = Tensor::empty({L, 2}, DType::kI64);
  for (int i = 0; i < 2; ++i) {
    models::DeepseekV3Cache& c = i == 0 ? a2 : b2;
    t.ids.data<int32_t>()[i] = next[static_cast<size_t>(i)];
    t.lengths.data<int32_t>()[i] = static_cast<int32_t>(c.length());
    for (int64_t l = 0; l < L; ++l)
      t.kv_rows.data<int64_t>()[l * 2 + i] = reinterpret_cast<intptr_t>(c.layers[static_cast<size_t>(l)].latent.data_ptr());
  }
  t.max_keys = 64;
  const Tensor got = m.forward_decode_table(t);
  EXPECT_TRUE(bitwise_equal(got, want));
  for (int64_t l = 0; l < L; ++l) {  // the appended rows too
    const auto& la = a.layers[static_cast<size_t>(l)];
    const auto& la2 = a2.layers[static_cast<size_t>(l)];
    EXPECT_TRUE(bitwise_equal(la2.latent.slice(0, 3, 4), la.latent.slice(0, 3, 4))) << "layer " << l;
  }
}

TEST_F(DecodeGraphs, ReplaysFollowTheTablesAcrossCachesOfOneKey) {
  // Two pairs of sequences with the same lengths share a key and so a graph; they take turns, so
  // each replay must read the other pair's caches, tokens and lengths from the tables.
  SCOPED_TRACE(seed);
  auto [p0, q0] = prefilled_twice(m, random_ids(4, V, seed));
  auto [p1, q1] = prefilled_twice(m, random_ids(6, V, seed + 1));
  auto [p2, q2] = prefilled_twice(m, random_ids(4, V, seed + 2));
  auto [p3, q3] = prefilled_twice(m, random_ids(6, V, seed + 3));
  runtime::DecodeGraphs graphs(m);
  for (int step = 0; step < 6; ++step) {
    const bool first_pair = step % 2 == 0;
    models::DeepseekV3Cache& g0 = first_pair ? p0 : p2;
    models::DeepseekV3Cache& g1 = first_pair ? p1 : p3;
    models::DeepseekV3Cache& e0 = first_pair ? q0 : q2;
    models::DeepseekV3Cache& e1 = first_pair ? q1 : q3;
    const auto ids = random_ids(2, V, seed + 10 + static_cast<uint64_t>(step));
    const Tensor want = m.forward_on_device({{{ids[0]}, &e0}, {{ids[1]}, &e1}});
    const Tensor got = graphs.step({{{ids[0]}, &g0}, {{ids[1]}, &g1}});
    ASSERT_TRUE(got.defined());
    EXPECT_TRUE(bitwise_equal(got, want)) << "step " << step;
    EXPECT_EQ(g0.length(), e0.length());
    EXPECT_EQ(g1.length(), e1.length());
  }
  // One key: its first step eager, its second recorded, then replays (the pairs' lengths differ
  // by one step, within one key bound).
  EXPECT_EQ(graphs.stats().eager_steps, 1);
  EXPECT_EQ(graphs.stats().recorded, 1);
  EXPECT_EQ(graphs.stats().replays, 5);
}

TEST_F(DecodeGraphs, GenerationMatchesEagerAcrossKeyBoundsAndBatchSizes) {
  // Sequences of different lengths leave at different steps (batch 3, then 2, then 1) and grow
  // past the first key bound (64 keys); greedy and sampled; the generator's lookahead off and on.
  SCOPED_TRACE(seed);
  for (const runtime::SamplingParams& sp : {runtime::SamplingParams{}, runtime::SamplingParams{0.8, 20, 0.95, seed}}) {
    const std::vector<runtime::GenerationRequest> reqs = {{random_ids(50, V, seed), 30, sp},
                                                          {random_ids(7, V, seed + 1), 12, sp},
                                                          {random_ids(20, V, seed + 2), 5, sp}};
    runtime::Generator eager(m, kv, {});
    const auto want = eager.generate(reqs);
    for (bool lookahead : {false, true}) {
      SCOPED_TRACE(lookahead ? "lookahead" : "no lookahead");
      runtime::DecodeGraphs graphs(m);
      runtime::Generator graphed(m, kv, {}, &graphs, lookahead);
      const auto got = graphed.generate(reqs);
      for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
      const auto& st = graphs.stats();
      EXPECT_GE(st.eager_steps, 4);  // keys (3, 64), (2, 64), (1, 64), (1, 128)
      EXPECT_GE(st.recorded, 3);
      EXPECT_GT(st.replays, 15);
      EXPECT_EQ(st.declined, 0);  // the prefill step never reaches it
      // With the lookahead, greedy steps chain on the device; sampled ones cannot.
      if (lookahead && sp.greedy()) EXPECT_GT(st.chained, 10);
      else EXPECT_EQ(st.chained, 0);
      EXPECT_EQ(kv.live_sequences(), 0);
    }
  }
}

TEST_F(DecodeGraphs, ChainedStepsTakeTheLastStepsGreedyTokensFromTheTables) {
  // step, its greedy tokens into the tables, then chained steps (placeholder ids): each equals
  // the eager forward of the argmax tokens, over twin caches.
  SCOPED_TRACE(seed);
  auto [a, a2] = prefilled_twice(m, random_ids(5, V, seed));
  auto [b, b2] = prefilled_twice(m, random_ids(9, V, seed + 1));
  runtime::DecodeGraphs graphs(m);
  std::vector<int32_t> ids = random_ids(2, V, seed + 2);
  Tensor got = graphs.step({{{ids[0]}, &a}, {{ids[1]}, &b}});
  Tensor want = m.forward_on_device({{{ids[0]}, &a2}, {{ids[1]}, &b2}});
  ASSERT_TRUE(bitwise_equal(got, want));
  for (int step = 0; step < 5; ++step) {
    auto tokens = graphs.greedy_tokens(got);
    got = graphs.step_chained({{{0}, &a}, {{0}, &b}});
    ASSERT_TRUE(got.defined()) << "step " << step;
    ids = tokens.wait();
    EXPECT_EQ(ids, runtime::argmax_rows(want)) << "step " << step;
    want = m.forward_on_device({{{ids[0]}, &a2}, {{ids[1]}, &b2}});
    EXPECT_TRUE(bitwise_equal(got, want)) << "step " << step;
    EXPECT_EQ(a.length(), a2.length());
  }
  EXPECT_EQ(graphs.stats().chained, 5);
  // No chaining without the last step's tokens queued, on other caches, at another batch size,
  // or after clear(): nothing runs then.
  const int64_t len = a.length();
  EXPECT_FALSE(graphs.step_chained({{{0}, &a}, {{0}, &b}}).defined());
  graphs.greedy_tokens(got);
  EXPECT_FALSE(graphs.step_chained({{{0}, &b}, {{0}, &a}}).defined());
  EXPECT_FALSE(graphs.step_chained({{{0}, &a}}).defined());
  graphs.clear();
  EXPECT_FALSE(graphs.step_chained({{{0}, &a}, {{0}, &b}}).defined());
  EXPECT_EQ(a.length(), len);
  EXPECT_EQ(graphs.stats().chained, 5);
}

TEST_F(DecodeGraphs, LookaheadPastEosDropsTheExtraStepAndItsCache) {
  // Greedy generation whose sequences end by an eos token while a chained step is in flight:
  // the same tokens and finish reasons as eager steps, every cache released, and the same stats.
  SCOPED_TRACE(seed);
  const std::vector<runtime::GenerationRequest> reqs = {{random_ids(6, V, seed), 40, {}},
                                                        {random_ids(11, V, seed + 1), 40, {}}};
  runtime::Generator probe(m, kv, {});
  const auto free_run = probe.generate(reqs);
  // An eos that the first sequence meets mid-way (and the second maybe elsewhere).
  const int32_t eos = free_run[0].tokens[free_run[0].tokens.size() / 2];
  runtime::Generator eager(m, kv, {eos});
  runtime::GenerationStats want_st, got_st;
  const auto want = eager.generate(reqs, {}, &want_st);
  runtime::DecodeGraphs graphs(m);
  runtime::Generator graphed(m, kv, {eos}, &graphs, /*lookahead=*/true);
  const auto got = graphed.generate(reqs, {}, &got_st);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "sequence " << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "sequence " << i;
  }
  EXPECT_EQ(want[0].finish_reason, "eos");
  EXPECT_EQ(got_st.decode_tokens, want_st.decode_tokens);
  EXPECT_GT(graphs.stats().chained, 0);
  EXPECT_EQ(kv.live_sequences(), 0);
}

TEST_F(DecodeGraphs, ASequenceDroppedOrAddedBesideALookaheadStep) {
  // BatchStepper with its lookahead on: a sequence dropped while a chained step holds it, then
  // one added, which takes its prefill in the step after the chained one's tokens.
  SCOPED_TRACE(seed);
  runtime::DecodeGraphs graphs(m);
  runtime::BatchStepper stepper(m, kv, {}, &graphs);
  stepper.set_lookahead(true);
  const uint64_t k0 = stepper.add({random_ids(4, V, seed), 30, {}});
  const uint64_t k1 = stepper.add({random_ids(8, V, seed + 1), 30, {}});
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(stepper.step().empty());
  EXPECT_GT(graphs.stats().chained, 0);
  const auto dropped = stepper.drop(k1);
  EXPECT_EQ(dropped.finish_reason, "cancelled");
  EXPECT_EQ(dropped.tokens.size(), 6u);
  EXPECT_EQ(kv.live_sequences(), 2);  // k1's cache waits for the step in flight
  runtime::BatchStepper::StepInfo info;
  stepper.step(&info);  // the chained step's tokens: k0's only
  EXPECT_EQ(info.decode_tokens, 1);
  EXPECT_EQ(kv.live_sequences(), 1);
  const uint64_t k2 = stepper.add({random_ids(3, V, seed + 2), 2, {}});
  stepper.step(&info);
  EXPECT_EQ(info.prompt_tokens, 3);
  EXPECT_EQ(info.decode_tokens, 1);
  const auto done = stepper.step();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].key, k2);
  EXPECT_EQ(done[0].result.tokens.size(), 2u);
  (void)k0;
}

TEST_F(DecodeGraphs, AtMostMaxGraphsAreKeptAndAnEvictedKeyRecordsAgain) {
  // One graph kept: batch sizes 2 and 1 take turns, each recording over the other's.
  SCOPED_TRACE(seed);
  auto [a, a2] = prefilled_twice(m, random_ids(5, V, seed));
  auto [b, b2] = prefilled_twice(m, random_ids(5, V, seed + 1));
  runtime::DecodeGraphs graphs(m, 1);
  for (int step = 0; step < 8; ++step) {
    const auto ids = random_ids(2, V, seed + 10 + static_cast<uint64_t>(step));
    const bool pair = step % 4 < 2;  // two steps of the pair, then two of `a` alone
    const Tensor want = pair ? m.forward_on_device({{{ids[0]}, &a2}, {{ids[1]}, &b2}})
                             : m.forward_on_device({{{ids[0]}, &a2}});
    const Tensor got = pair ? graphs.step({{{ids[0]}, &a}, {{ids[1]}, &b}}) : graphs.step({{{ids[0]}, &a}});
    ASSERT_TRUE(got.defined());
    EXPECT_TRUE(bitwise_equal(got, want)) << "step " << step;
  }
  EXPECT_EQ(graphs.stats().eager_steps, 2);  // each key's first step
  // Recorded at steps 1 (pair), 3 (alone, evicting the pair's), 4 (pair again, evicting) and 6.
  EXPECT_EQ(graphs.stats().recorded, 4);
  EXPECT_EQ(graphs.stats().evicted, 3);
  EXPECT_EQ(graphs.stats().replays, 6);
  expect_error([&] { runtime::DecodeGraphs(m, 0); }, {"max_graphs"});
}

TEST_F(DecodeGraphs, AReplayAfterAnInPlaceReloadUsesTheNewWeights) {
  // Reloads keep every weight's address, so a recorded step stays valid and reads the new values
  // (tests/cuda/cuda_decode_graphs_test.cpp holds the CUDA graph to it).
  const int64_t D = lm.config.hidden_size;
  SCOPED_TRACE(seed);
  auto [a, a2] = prefilled_twice(m, random_ids(5, V, seed));
  runtime::DecodeGraphs graphs(m);
  for (int step = 0; step < 2; ++step) {  // the key's eager step, then its recorded one
    const int32_t id = random_ids(1, V, seed + 10 + static_cast<uint64_t>(step))[0];
    m.forward_on_device({{{id}, &a2}});
    ASSERT_TRUE(graphs.step({{{id}, &a}}).defined());
  }
  const int32_t id = random_ids(1, V, seed + 20)[0];
  m.reload({{"lm_head.weight", randn({V, D}, DType::kBF16, seed + 21)}});
  const Tensor want = m.forward_on_device({{{id}, &a2}});
  const Tensor got = graphs.step({{{id}, &a}});
  EXPECT_TRUE(bitwise_equal(got, want));
  EXPECT_EQ(graphs.stats().recorded, 1);
  EXPECT_EQ(graphs.stats().replays, 2);
}

TEST_F(DecodeGraphs, StepsWithSeveralTokensAreLeftToTheCallerUntouched) {
  auto cache = m.new_cache(32);
  runtime::DecodeGraphs graphs(m);
  EXPECT_FALSE(graphs.step({{{1, 2, 3}, &cache}}).defined());
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(graphs.stats().declined, 1);
  // Bad input is refused before anything runs, as by forward().
  expect_error([&] { graphs.step({{{static_cast<int32_t>(lm.config.vocab_size)}, &cache}}); }, {"outside the vocabulary"});
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(runtime::DecodeGraphs::key_bound(0), 64);
  EXPECT_EQ(runtime::DecodeGraphs::key_bound(63), 64);
  EXPECT_EQ(runtime::DecodeGraphs::key_bound(64), 128);
}

}  // namespace
}  // namespace locus::testing
