// The DeepSeek-V3 model on the tiny checkpoint (2 layers: one dense, one MoE; YaRN; q_lora):
// against an independent fp64 forward, LD off vs on, NVFP4 vs BF16, KV-cache decode vs prefill.
#include "models/deepseek_v3.h"

#include <gtest/gtest.h>

#include <iostream>

#include "model_test_util.h"
#include "runtime/generator.h"

namespace locus::testing {
namespace {

TEST(DeepseekV3Model, LogitsMatchFp64ReferenceForward) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "model seed " << tiny_model_seed() << ", ids seed " << seed);
  auto lm = load_model(tiny_model_dir(false, kRefInitStd), 0);
  const auto& cfg = lm.config;
  ASSERT_GE(cfg.num_hidden_layers, 2);
  ASSERT_TRUE(cfg.is_moe_layer(1) && !cfg.is_moe_layer(0));
  auto ck = std::make_shared<runtime::Checkpoint>(runtime::Checkpoint::open(tiny_model_dir(false, kRefInitStd)));
  std::vector<double> ref;
  const auto ids = ids_with_clear_routing(ref_config(cfg), checkpoint_weights(ck), 9, seed, &ref);
  ASSERT_EQ(ids.size(), 9u);
  Tensor logits = prefill_logits(*lm.model, ids);
  ASSERT_EQ(logits.shape(), (Shape{9, cfg.vocab_size}));
  const double err = rel_error(logits, ref);
  std::cout << "[ info     ] logits vs fp64 reference: rel error " << err << "\n";
  EXPECT_LT(err, kBf16ModelTolerance);
}

TEST(DeepseekV3Model, Nvfp4LogitsMatchReferenceOnDequantizedWeightsAndStayNearBf16) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "model seed " << tiny_model_seed() << ", ids seed " << seed);
  auto nv = load_model(tiny_model_dir(true, kRefInitStd), 0);
  ASSERT_TRUE(nv.quant.quantized());
  // Strong check: the fp64 reference with the NVFP4 weights dequantized in the test.
  auto ck = std::make_shared<runtime::Checkpoint>(runtime::Checkpoint::open(tiny_model_dir(true, kRefInitStd)));
  std::vector<double> ref;
  const auto ids = ids_with_clear_routing(ref_config(nv.config), checkpoint_weights(ck), 6, seed, &ref);
  ASSERT_EQ(ids.size(), 6u);
  Tensor l_nv = prefill_logits(*nv.model, ids);
  const double err_ref = rel_error(l_nv, ref);
  std::cout << "[ info     ] NVFP4 logits vs fp64 reference on dequantized weights: rel error " << err_ref << "\n";
  EXPECT_LT(err_ref, kBf16ModelTolerance);
  // Same seed BF16 model: the NVFP4 checkpoint quantizes the same weights. Per weight, e2m1 with
  // a per-16 e4m3 scale keeps about one mantissa bit (relative RMS error near 0.1 on normal
  // values; bounded here by 0.2). End to end the error is not tight: a perturbed router input
  // can flip an expert choice, which moves the logits by far more than the rounding (seen up to
  // ~0.7 on some seeds). So the logits must differ (the quantized path ran) and still carry the
  // BF16 model's signal (error below the logits' own norm).
  auto bf_ck = std::make_shared<runtime::Checkpoint>(runtime::Checkpoint::open(tiny_model_dir(false, kRefInitStd)));
  auto nv_w = checkpoint_weights(ck), bf_w = checkpoint_weights(bf_ck);
  int quantized = 0;
  for (const auto& name : ck->names()) {
    if (ck->dtype(name) != DType::kU8 && ck->dtype(name) != DType::kFP4E2M1x2) continue;
    const int64_t numel = shape_numel(bf_ck->shape(name));
    const double w_err = rel_error(nv_w(name, numel), bf_w(name, numel));
    EXPECT_LT(w_err, 0.2) << name;
    EXPECT_GT(w_err, 0.0) << name;
    ++quantized;
  }
  EXPECT_GT(quantized, 0);
  auto bf = load_model(tiny_model_dir(false, kRefInitStd), 0);
  Tensor l_bf = prefill_logits(*bf.model, ids);
  const double err = rel_error(l_nv, to_doubles(l_bf));
  std::cout << "[ info     ] NVFP4 vs BF16 logits (same seed): rel error " << err << "\n";
  EXPECT_GT(err, 1e-4);
  EXPECT_LT(err, 1.0);
}

void expect_ld_matches_off(int domains) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << domains << " domains, model seed " << tiny_model_seed() << ", ids seed " << seed);
  auto off = load_model(tiny_model_dir(false), 0);
  auto on = load_model(tiny_model_dir(false), domains);
  ASSERT_EQ(on.topology.num_domains, domains);
  // The LD run must really be partitioned: enabled plans, weight bytes in every domain.
  std::vector<modules::PlanRecord> plans;
  on.model->collect_plans(&plans);
  int enabled = 0;
  for (const auto& p : plans) {
    enabled += p.plan.enabled;
    if (p.module == "lm_head") EXPECT_FALSE(p.plan.enabled) << p.describe();
  }
  EXPECT_GT(enabled, 0);
  const auto mem = on.model->memory();
  for (int d = 0; d < domains; ++d) EXPECT_GT(mem.domain_bytes(d), 0) << "domain " << d;
  EXPECT_EQ(off.model->memory().domain_bytes(0), 0);

  const auto ids = random_ids(7, off.config.vocab_size, seed);
  Tensor a = prefill_logits(*off.model, ids), b = prefill_logits(*on.model, ids);
  EXPECT_TRUE(bitwise_equal(a, b)) << "rel error " << rel_error(b, to_doubles(a));

  // Greedy generation: identical tokens, decode (absorbed) steps included.
  auto gen = [&](runtime::LoadedModel& lm) {
    runtime::KvCacheManager kv(lm.config, lm.device, {64 << 20, "test"}, 2, 256);
    runtime::Generator g(*lm.model, kv, {});
    runtime::GenerationRequest r;
    r.prompt = ids;
    r.max_new_tokens = 6;
    return g.generate({r})[0].tokens;
  };
  EXPECT_EQ(gen(off), gen(on));
}

TEST(DeepseekV3Model, LocalityDomainsOnGiveBitwiseIdenticalLogitsAndTokens2Domains) { expect_ld_matches_off(2); }
TEST(DeepseekV3Model, LocalityDomainsOnGiveBitwiseIdenticalLogitsAndTokens4Domains) { expect_ld_matches_off(4); }

TEST(DeepseekV3Model, IncrementalDecodeMatchesFullPrefill) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  auto lm = load_model(tiny_model_dir(false), 0);
  auto& m = *lm.model;
  const int64_t V = lm.config.vocab_size;
  // Decode (absorbed) and prefill attention differ by BF16 rounding; a routing near-tie could
  // turn that into a different expert choice, so the ids avoid near-ties.
  auto ck = std::make_shared<runtime::Checkpoint>(runtime::Checkpoint::open(tiny_model_dir(false)));
  std::vector<double> unused_ref;
  const auto ids = ids_with_clear_routing(ref_config(lm.config), checkpoint_weights(ck), 8, seed, &unused_ref);
  ASSERT_EQ(ids.size(), 8u);
  for (auto path : {modules::MlaPath::kPrefill, modules::MlaPath::kAuto}) {
    SCOPED_TRACE(modules::mla_path_name(path));
    Tensor full = prefill_logits(m, ids, modules::MlaPath::kPrefill);
    auto cache = m.new_cache(16);
    std::vector<int32_t> head(ids.begin(), ids.begin() + 5);
    Tensor first = m.forward({{head, &cache}}, false, path);
    EXPECT_EQ(cache.length(), 5);
    EXPECT_TRUE(bitwise_equal(first.view({V}), full.select(0, 4).clone()));
    for (int64_t t = 5; t < 8; ++t) {
      Tensor step = m.forward({{{ids[t]}, &cache}}, false, path);
      EXPECT_EQ(cache.length(), t + 1);
      Tensor want = full.select(0, t).clone();
      if (path == modules::MlaPath::kPrefill) {
        // Same arithmetic as the full prefill: each query row attends over the same keys in the same order.
        EXPECT_TRUE(bitwise_equal(step.view({V}), want)) << "position " << t;
      } else {
        // Decode uses the absorbed MLA form: equal up to BF16 rounding of the attention.
        const double err = rel_error(step.view({V}), to_doubles(want));
        std::cout << "[ info     ] absorbed decode vs prefill at position " << t << ": rel error " << err << "\n";
        EXPECT_LT(err, kBf16ModelTolerance) << "position " << t;
      }
    }
  }
}

TEST(DeepseekV3Model, BatchOfSequencesMatchesEachAlone) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  auto lm = load_model(tiny_model_dir(false), 0);
  auto& m = *lm.model;
  const int64_t V = lm.config.vocab_size;
  const auto a = random_ids(5, V, seed), b = random_ids(3, V, seed + 1);
  auto ca = m.new_cache(8), cb = m.new_cache(8);
  Tensor both = m.forward({{a, &ca}, {b, &cb}});
  ASSERT_EQ(both.shape(), (Shape{2, V}));
  auto c1 = m.new_cache(8), c2 = m.new_cache(8);
  EXPECT_TRUE(bitwise_equal(both.select(0, 0).clone(), m.forward({{a, &c1}}).view({V})));
  EXPECT_TRUE(bitwise_equal(both.select(0, 1).clone(), m.forward({{b, &c2}}).view({V})));
}

TEST(DeepseekV3Model, BadForwardInputsAreErrorsAndLeaveCachesUntouched) {
  auto lm = load_model(tiny_model_dir(false), 0);
  auto& m = *lm.model;
  const int32_t V = static_cast<int32_t>(lm.config.vocab_size);
  auto cache = m.new_cache(4);
  expect_error([&] { m.forward({}); }, {"empty batch"});
  expect_error([&] { m.forward({{{}, &cache}}); }, {"no tokens"});
  expect_error([&] { m.forward({{{1, V}, &cache}}); }, {"token id", std::to_string(V)});
  expect_error([&] { m.forward({{{1, 2, 3, 4, 5}, &cache}}); }, {"KV cache", "4"});
  expect_error([&] { m.forward({{{1}, &cache}, {{2}, &cache}}); }, {"share one KV cache"});
  EXPECT_EQ(cache.length(), 0);
  m.forward({{{1, 2}, &cache}});
  EXPECT_EQ(cache.length(), 2);
}

TEST(DeepseekV3Model, ModulesAreNamedByTheirHfPrefixes) {
  auto lm = load_model(tiny_model_dir(false), 2);
  auto& m = *lm.model;
  EXPECT_EQ(m.embed_tokens().name(), "model.embed_tokens");
  EXPECT_EQ(m.layer(0).self_attn().name(), "model.layers.0.self_attn");
  ASSERT_NE(m.layer(1).moe(), nullptr);
  EXPECT_EQ(m.layer(1).moe()->name(), "model.layers.1.mlp");
  EXPECT_EQ(m.lm_head().name(), "lm_head");
  EXPECT_FALSE(m.lm_head().plan().enabled);
  // Every module got the planner: the MoE experts were planned under their HF name.
  std::vector<modules::PlanRecord> plans;
  m.collect_plans(&plans);
  bool experts = false;
  for (const auto& p : plans) experts = experts || p.module == "model.layers.1.mlp.experts";
  EXPECT_TRUE(experts);
  EXPECT_EQ(m.state(), modules::LifecycleState::kLocalized);
}

}  // namespace
}  // namespace locus::testing

namespace locus::testing {
namespace {

// A reload is all or nothing: a bad tensor in one layer leaves every layer's weights as they were,
// even when another layer's tensor in the same call was valid.
TEST(DeepseekV3Model, ReloadWithOneBadTensorChangesNothing) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  auto lm = load_model(tiny_model_dir(false), 2);
  auto& m = *lm.model;
  const auto& c = lm.config;
  const auto ids = random_ids(4, c.vocab_size, seed);
  auto cache0 = m.new_cache(8);
  const Tensor before = m.forward({{ids, &cache0}}).clone();

  const Tensor good = randn({c.hidden_size, c.intermediate_size}, DType::kBF16, seed + 1, 0.05);
  const Tensor bad = randn({c.hidden_size + 1, c.num_attention_heads * c.v_head_dim}, DType::kBF16, seed + 2);
  expect_error([&] {
    m.reload({{"model.layers.0.mlp.down_proj.weight", good}, {"model.layers.1.self_attn.o_proj.weight", bad}});
  }, {"o_proj"});
  auto cache1 = m.new_cache(8);
  EXPECT_TRUE(bitwise_equal(m.forward({{ids, &cache1}}), before));

  m.reload({{"model.layers.0.mlp.down_proj.weight", good}});
  auto cache2 = m.new_cache(8);
  EXPECT_FALSE(bitwise_equal(m.forward({{ids, &cache2}}), before));
}

}  // namespace
}  // namespace locus::testing
