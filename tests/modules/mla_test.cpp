// MLA: fp64 reference of the whole block, prefill (expanded) vs decode (absorbed) paths, batched
// sequences, decode after prefill, locality on (1, 2, 4 domains) vs off bit for bit, and the
// lifecycle of the absorbed k_b / v_b weights (sharded over heads, rewritten in place on reload).
#include "modules/mla.h"

#include <gtest/gtest.h>

#include "core/device_hooks.h"
#include "mla_test_util.h"

namespace locus::testing {
namespace {

TEST(MlaTest, BothPathsMatchFp64ReferenceAndEachOther) {
  for (int64_t q_lora : {32, 0}) {  // V3 (q_a/q_b) and V2-Lite (plain q_proj)
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " q_lora " << q_lora);
    const MlaConfig c = small_cfg(q_lora);
    MlaWeights w(c, seed);
    auto m = build(make_ld(0).ctx("model.layers.0.self_attn"), c, w);
    EXPECT_GT(m->softmax_scale(), 1.0 / std::sqrt(24.0));  // YaRN mscale^2 > 1
    Tensor x = randn({6, c.hidden_size}, DType::kBF16, seed + 100);
    const Mat ref = ref_mla(*m, w, x);
    MlaKvCache c1 = new_cache(c), c2 = new_cache(c);
    const Tensor yp = run(*m, c1, x, MlaPath::kPrefill), ya = run(*m, c2, x, MlaPath::kAbsorbed);
    EXPECT_EQ(c1.length, 6);
    EXPECT_LT(rel_error(yp, ref.v), kMlaTolerance);
    EXPECT_LT(rel_error(ya, ref.v), kMlaTolerance);
    EXPECT_LT(rel_error(ya, to_doubles(yp)), kMlaTolerance);
    // Both paths wrote the same latent cache.
    EXPECT_TRUE(bitwise_equal(c1.latent.slice(0, 0, 6), c2.latent.slice(0, 0, 6)));
  }
}

TEST(MlaTest, DecodeAfterPrefillAndBatchedSequences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MlaConfig c = small_cfg(32);
  MlaWeights w(c, seed);
  auto m = build(make_ld(0).ctx("attn"), c, w);
  Tensor x = randn({7, c.hidden_size}, DType::kBF16, seed + 1);
  // 5 tokens of prefill, then 2 decode steps (auto: absorbed for one token) vs all 7 at once.
  MlaKvCache all = new_cache(c), inc = new_cache(c);
  const Tensor y_all = run(*m, all, x, MlaPath::kPrefill);
  run(*m, inc, x.slice(0, 0, 5), MlaPath::kAuto);
  const Tensor y5 = run(*m, inc, x.slice(0, 5, 6), MlaPath::kAuto);
  const Tensor y6 = run(*m, inc, x.slice(0, 6, 7), MlaPath::kAuto);
  EXPECT_EQ(inc.length, 7);
  EXPECT_LT(rel_error(y5, to_doubles(y_all.slice(0, 5, 6))), kMlaTolerance);
  EXPECT_LT(rel_error(y6, to_doubles(y_all.slice(0, 6, 7))), kMlaTolerance);
  // Two sequences in one call give exactly what they give alone.
  MlaKvCache a = new_cache(c), b = new_cache(c), a1 = new_cache(c), b1 = new_cache(c);
  run(*m, a, x.slice(0, 0, 3), MlaPath::kPrefill);
  run(*m, a1, x.slice(0, 0, 3), MlaPath::kPrefill);
  Tensor xb = x.slice(0, 3, 5).clone();
  for (MlaPath path : {MlaPath::kPrefill, MlaPath::kAbsorbed}) {
    Tensor y = Tensor::empty({2, c.hidden_size}, DType::kBF16);
    Tensor pos = Tensor::empty({2}, DType::kI32);
    pos.data<int32_t>()[0] = static_cast<int32_t>(a.length);
    pos.data<int32_t>()[1] = static_cast<int32_t>(b.length);
    m->forward(xb, pos, {{&a, 1}, {&b, 1}}, y, path);
    const Tensor ya = run(*m, a1, xb.slice(0, 0, 1), path), yb = run(*m, b1, xb.slice(0, 1, 2), path);
    EXPECT_TRUE(bitwise_equal(y.slice(0, 0, 1), ya));
    EXPECT_TRUE(bitwise_equal(y.slice(0, 1, 2), yb));
  }
  // And the latent rows the batch appended (made for both sequences at once) are theirs alone.
  ASSERT_EQ(a.length, a1.length);
  ASSERT_EQ(b.length, b1.length);
  EXPECT_TRUE(bitwise_equal(a.latent.slice(0, 0, a.length), a1.latent.slice(0, 0, a1.length)));
  EXPECT_TRUE(bitwise_equal(b.latent.slice(0, 0, b.length), b1.latent.slice(0, 0, b1.length)));
}

TEST(MlaTest, LocalityOnMatchesOffBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MlaConfig c = small_cfg(32);
  MlaWeights w(c, seed);
  Tensor x = randn({5, c.hidden_size}, DType::kBF16, seed + 1);
  auto off = build(make_ld(0).ctx("model.layers.1.self_attn"), c, w);
  MlaKvCache k0 = new_cache(c), k1 = new_cache(c);
  const Tensor yp_off = run(*off, k0, x, MlaPath::kPrefill), ya_off = run(*off, k1, x, MlaPath::kAbsorbed);
  for (int domains : {1, 2, 4}) {
    SCOPED_TRACE(domains);
    auto on = build(make_ld(domains).ctx("model.layers.1.self_attn"), c, w);
    EXPECT_EQ(on->k_b_plan().enabled, domains > 1) << on->k_b_plan().describe();
    EXPECT_EQ(on->v_b_plan().enabled, domains > 1) << on->v_b_plan().describe();
    EXPECT_EQ(on->kv_b_proj().partitioned(), domains > 1) << on->kv_b_proj().plan().describe();
    EXPECT_EQ(on->q_b_proj()->partitioned(), domains > 1);
    EXPECT_EQ(on->o_proj().partitioned(), domains > 1);
    EXPECT_FALSE(on->kv_a_proj_with_mqa().partitioned());
    EXPECT_NE(on->kv_a_proj_with_mqa().plan().reason.find("never partitioned"), std::string::npos);
    EXPECT_EQ(on->k_b().size(), static_cast<size_t>(domains > 1 ? domains : 1));
    MlaKvCache c0 = new_cache(c), c1 = new_cache(c);
    EXPECT_TRUE(bitwise_equal(run(*on, c0, x, MlaPath::kPrefill), yp_off));
    EXPECT_TRUE(bitwise_equal(run(*on, c1, x, MlaPath::kAbsorbed), ya_off));
  }
}

TEST(MlaTest, AbsorbedShardsAreReleasedAndRewrittenInPlaceOnReload) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MlaConfig c = small_cfg(32);
  MlaWeights w(c, seed), w2(c, seed + 500);
  Tensor x = randn({4, c.hidden_size}, DType::kBF16, seed + 1);
  MLA m(make_ld(2).ctx("model.layers.2.self_attn"), c);
  for (const auto& [k, v] : w.map) m.load(k, v);
  EXPECT_EQ(m.state(), modules::LifecycleState::kLoaded);
  m.transform();
  const int64_t H = c.num_heads, dn = c.qk_nope_head_dim, dv = c.v_head_dim, dc = c.kv_lora_rank;
  ASSERT_EQ(m.k_b().size(), 1u);
  EXPECT_EQ(m.k_b()[0].shape(), (Shape{H, dn, dc}));
  EXPECT_EQ(m.v_b()[0].shape(), (Shape{H, dv, dc}));
  const int64_t live_none = memory_stats(Device::cpu(), -1).live_bytes;
  const int64_t held_none = m.memory().domain_bytes(-1);
  m.localize();
  ASSERT_EQ(m.k_b().size(), 2u);
  EXPECT_EQ(m.k_b()[0].domain(), 0);
  EXPECT_EQ(m.v_b()[1].domain(), 1);
  // What stays outside the domains: kv_a_proj, the norms (the partitioned Linears and the
  // absorbed weights moved into domain shards).
  const int64_t kv_a = (dc + c.qk_rope_head_dim) * c.hidden_size * 2, norms = (c.q_lora_rank + dc) * 2;
  EXPECT_EQ(m.memory().domain_bytes(-1), kv_a + norms);
  EXPECT_EQ(memory_stats(Device::cpu(), -1).live_bytes, live_none - (held_none - kv_a - norms));
  MlaKvCache k0 = new_cache(c);
  const Tensor y1 = run(m, k0, x, MlaPath::kAbsorbed);
  std::vector<const void*> ptrs{m.k_b()[0].data_ptr(), m.k_b()[1].data_ptr(), m.v_b()[0].data_ptr(), m.v_b()[1].data_ptr()};
  m.localize();  // no-op
  // Reload only kv_b_proj: the Linear's shards and the absorbed shards are rewritten in place.
  m.reload({{"kv_b_proj.weight", w2.map.at("kv_b_proj.weight")}});
  EXPECT_EQ(ptrs, (std::vector<const void*>{m.k_b()[0].data_ptr(), m.k_b()[1].data_ptr(), m.v_b()[0].data_ptr(),
                                            m.v_b()[1].data_ptr()}));
  MlaWeights mixed = w;
  mixed.map["kv_b_proj.weight"] = w2.map.at("kv_b_proj.weight");
  auto fresh = build(make_ld(0).ctx("model.layers.2.self_attn"), c, mixed);
  MlaKvCache k1 = new_cache(c), k2 = new_cache(c);
  const Tensor y2 = run(m, k1, x, MlaPath::kAbsorbed);
  EXPECT_FALSE(bitwise_equal(y1, y2));
  EXPECT_TRUE(bitwise_equal(y2, run(*fresh, k2, x, MlaPath::kAbsorbed)));
  // A bad piece anywhere: nothing is written (kv_b_proj included).
  modules::WeightMap bad = w.map;
  bad["o_proj.weight"] = randn({c.hidden_size, H * dv + 8}, DType::kBF16, seed);
  EXPECT_THROW(m.reload(bad), Error);
  MlaKvCache k3 = new_cache(c);
  EXPECT_TRUE(bitwise_equal(run(m, k3, x, MlaPath::kAbsorbed), y2));
  // rebuild() re-derives the absorbed weights from kv_b_proj: nothing changes.
  m.rebuild();
  MlaKvCache k4 = new_cache(c);
  EXPECT_TRUE(bitwise_equal(run(m, k4, x, MlaPath::kAbsorbed), y2));
  std::vector<modules::PlanRecord> plans;
  m.collect_plans(&plans);
  EXPECT_EQ(plans.back().module, "model.layers.2.self_attn.v_b_proj");
  EXPECT_EQ(plans.back().op, "bmm");
}

TEST(MlaTest, BadCallsAreErrorsThatWriteNothing) {
  const uint64_t seed = fresh_seed();
  const MlaConfig c = small_cfg(32);
  MlaWeights w(c, seed);
  MLA m(make_ld(0).ctx("attn"), c);
  Tensor x = randn({3, c.hidden_size}, DType::kBF16, seed + 1);
  MlaKvCache k = new_cache(c, 4);
  Tensor y = Tensor::empty({3, c.hidden_size}, DType::kBF16);
  EXPECT_THROW(m.forward(x, positions(0, 3), {{&k, 3}}, y), Error);  // not loaded
  EXPECT_THROW(m.load("q_b.weight", w.map.at("q_b_proj.weight")), Error);
  for (const auto& [n, v] : w.map) m.load(n, v);
  m.transform();
  run(m, k, x, MlaPath::kPrefill);
  EXPECT_THROW(m.forward(x, positions(3, 3), {{&k, 3}}, y), Error);  // 3 + 3 > capacity 4
  EXPECT_EQ(k.length, 3);
  EXPECT_THROW(m.forward(x, positions(3, 3), {{&k, 2}}, y), Error);  // rows do not add up
  MlaKvCache wrong = MlaKvCache::allocate(8, 16, 8);
  EXPECT_THROW(m.forward(x, positions(0, 3), {{&wrong, 3}}, y), Error);
  MlaConfig bad = c;
  bad.qk_rope_head_dim = 7;
  EXPECT_THROW(MLA(make_ld(0).ctx("attn"), bad), Error);
}

}  // namespace
}  // namespace locus::testing
