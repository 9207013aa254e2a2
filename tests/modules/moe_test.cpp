// MoE module: fp64 reference, locality on (1, 2, 4 domains) vs off bit for bit, both checkpoint
// forms (per-expert and HF fused), the expert weight lifecycle, and NVFP4 experts.
#include "modules/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "core/device_hooks.h"
#include "core/host_profile.h"
#include "module_test_util.h"
#include "moe_test_util.h"

namespace locus::testing {
namespace {

using modules::MoE;
using modules::MoeConfig;

MoeConfig small_cfg(int64_t H, int64_t I, int64_t E, int64_t shared) {
  MoeConfig c;
  c.hidden_size = H;
  c.intermediate_size = I;
  c.num_experts = E;
  c.top_k = 2;
  c.n_group = 2;
  c.topk_group = 1;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.n_shared_experts = shared;
  return c;
}

std::unique_ptr<MoE> build(const modules::ModuleContext& ctx, const MoeConfig& c, const MoeWeights& w) {
  auto moe = std::make_unique<MoE>(ctx, c);
  for (const auto& [k, v] : w.per_expert()) moe->load(k, v);
  moe->transform();
  moe->localize();
  return moe;
}

Tensor run(const MoE& m, const Tensor& x) {
  Tensor y = Tensor::empty({x.size(0), m.config().hidden_size}, DType::kBF16);
  y.fill_nan_();
  m.forward(x, y);
  return y;
}

// sum_j w_j expert_{e_j}(x) + shared(x) with the module's routing (checked on its own in
// moe_routing_test); intermediates the module stores in bf16 are rounded the same way.
Mat ref_moe(const MoE& moe, const Tensor& x, const MoeWeights& w) {
  const MoeConfig& c = moe.config();
  const int64_t T = x.size(0), K = c.top_k, H = c.hidden_size;
  Tensor rw = Tensor::empty({T, K}, DType::kFP32), ids = Tensor::empty({T, K}, DType::kI32);
  moe.route(x, rw, ids);
  Mat X(x), out(T, H);
  if (w.sg.defined()) out = round_bf16(ref_linear(round_bf16(ref_swiglu(X, Mat(w.sg), Mat(w.su))), Mat(w.sd)));
  for (int64_t t = 0; t < T; ++t) {
    Mat xt = X.rows_range(t, t + 1);
    for (int64_t j = 0; j < K; ++j) {
      const int e = ids.data<int32_t>()[t * K + j];
      Mat h = round_bf16(ref_swiglu(xt, Mat(w.g[e]), Mat(w.u[e])));
      Mat o = ref_linear(h, Mat(w.d[e]));
      for (int64_t c2 = 0; c2 < H; ++c2) out.at(t, c2) += rw.data<float>()[t * K + j] * o.at(0, c2);
    }
  }
  return out;
}

TEST(MoeTest, MatchesFp64ReferenceAndLocalityIsBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MoeConfig c = small_cfg(64, 64, 4, 1);
  MoeWeights w(c, seed);
  Tensor x = randn({9, c.hidden_size}, DType::kBF16, seed + 100);
  auto off = build(make_ld(0).ctx("model.layers.3.mlp"), c, w);
  const Tensor y_off = run(*off, x);
  EXPECT_LT(rel_error(y_off, ref_moe(*off, x, w).v), bf16_gemm_tolerance(c.intermediate_size));
  for (int domains : {1, 2, 4}) {
    SCOPED_TRACE(domains);
    auto on = build(make_ld(domains).ctx("model.layers.3.mlp"), c, w);
    EXPECT_EQ(on->experts_plan().enabled, domains > 1) << on->experts_plan().describe();
    EXPECT_EQ(on->expert_gate_up(0).partitioned(), domains > 1);
    EXPECT_FALSE(on->gate().partitioned());
    EXPECT_FALSE(on->shared_experts()->gate_up_proj().partitioned());
    EXPECT_TRUE(bitwise_equal(run(*on, x), y_off));
  }
}

TEST(MoeTest, FusedHfFormLoadsTheSameWeights) {
  const uint64_t seed = fresh_seed();
  const MoeConfig c = small_cfg(32, 32, 4, 0);
  MoeWeights w(c, seed);
  Tensor x = randn({5, c.hidden_size}, DType::kBF16, seed + 1);
  auto a = build(make_ld(2).ctx("mlp"), c, w);
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.intermediate_size;
  Tensor gate_up = Tensor::empty({E, 2 * I, H}, DType::kBF16), down = Tensor::empty({E, H, I}, DType::kBF16);
  for (int64_t e = 0; e < E; ++e) {
    gate_up.select(0, e).slice(0, 0, I).copy_(w.g[e]);
    gate_up.select(0, e).slice(0, I, 2 * I).copy_(w.u[e]);
    down.select(0, e).copy_(w.d[e]);
  }
  MoE b(make_ld(2).ctx("mlp"), c);
  b.load("gate.weight", w.gate);
  b.load("gate.e_score_correction_bias", w.bias);
  EXPECT_THROW(b.load_fused_experts(gate_up, down.slice(1, 0, H - 1)), Error);
  b.load_fused_experts(gate_up, down);
  b.localize();
  EXPECT_TRUE(bitwise_equal(run(b, x), run(*a, x)));
  // The same through load() with the HF names.
  MoE d(make_ld(0).ctx("mlp"), c);
  d.load("gate.weight", w.gate);
  d.load("gate.e_score_correction_bias", w.bias);
  d.load("experts.gate_up_proj", gate_up);
  d.load("experts.down_proj", down);
  d.transform();
  EXPECT_TRUE(bitwise_equal(run(d, x), run(*a, x)));
}

TEST(MoeTest, LocalizeReleasesExpertWeightsAndReloadIsInPlace) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MoeConfig c = small_cfg(32, 32, 4, 1);
  MoeWeights w(c, seed), w2(c, seed + 1000);
  Tensor x = randn({6, c.hidden_size}, DType::kBF16, seed + 1);
  MoE moe(make_ld(2).ctx("model.layers.5.mlp"), c);
  EXPECT_FALSE(moe.missing_pieces().empty());
  for (const auto& [k, v] : w.per_expert()) moe.load(k, v);
  EXPECT_TRUE(moe.missing_pieces().empty());
  moe.transform();
  const int64_t expert_bytes = c.num_experts * 3 * c.intermediate_size * c.hidden_size * 2;
  const int64_t before = moe.memory().domain_bytes(-1);
  const int64_t live_none = memory_stats(Device::cpu(), -1).live_bytes;
  moe.localize();
  EXPECT_EQ(moe.memory().domain_bytes(-1), before - expert_bytes);  // router, bias, shared stay whole
  EXPECT_EQ(memory_stats(Device::cpu(), -1).live_bytes, live_none - expert_bytes);
  EXPECT_EQ(moe.memory().domain_bytes(0) + moe.memory().domain_bytes(1), expert_bytes);
  const Tensor y1 = run(moe, x);
  std::vector<const void*> ptrs;
  for (int64_t e = 0; e < c.num_experts; ++e)
    for (const void* p : moe.expert_gate_up(e).weight_data_ptrs()) ptrs.push_back(p);
  moe.localize();  // no-op
  moe.reload(w2.per_expert());
  std::vector<const void*> ptrs2;
  for (int64_t e = 0; e < c.num_experts; ++e)
    for (const void* p : moe.expert_gate_up(e).weight_data_ptrs()) ptrs2.push_back(p);
  EXPECT_EQ(ptrs, ptrs2);
  const Tensor y2 = run(moe, x);
  EXPECT_FALSE(bitwise_equal(y1, y2));
  auto fresh = build(make_ld(0).ctx("model.layers.5.mlp"), c, w2);
  EXPECT_TRUE(bitwise_equal(y2, run(*fresh, x)));
  // A bad piece anywhere: nothing is written.
  modules::WeightMap bad = w.per_expert();
  bad["experts.3.down_proj.weight"] = randn({c.hidden_size, c.intermediate_size + 8}, DType::kBF16, seed);
  EXPECT_THROW(moe.reload(bad), Error);
  EXPECT_TRUE(bitwise_equal(run(moe, x), y2));
  EXPECT_THROW(moe.reload({{"experts.4.down_proj.weight", w.d[0]}}), Error);  // expert out of range
  EXPECT_THROW(moe.load("experts.0.gate_proj.weight", w.g[0]), Error);       // load after transform
  std::vector<modules::PlanRecord> plans;
  moe.collect_plans(&plans);
  ASSERT_GE(plans.size(), 2u);
  EXPECT_EQ(plans[0].module, "model.layers.5.mlp.gate");
  EXPECT_NE(plans[0].plan.reason.find("never partitioned"), std::string::npos);
  EXPECT_EQ(plans[1].module, "model.layers.5.mlp.experts");
  EXPECT_TRUE(plans[1].plan.enabled);
}

// Gate and up with scales of their own (gate/up products apart, then SwiGLU), and with one
// shared scale (ModelOpt's DeepSeek export; the fused weight, and the experts run as row blocks).
TEST(MoeTest, Nvfp4ExpertsMatchReferenceAndLocalityIsBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  MoeConfig c = small_cfg(256, 256, 2, 0);  // NVFP4 partitions need 128-row multiples
  c.top_k = 1;
  c.n_group = 1;
  c.expert_quant = locality::QuantKind::kNVFP4;
  for (const bool shared_scale : {false, true}) {
    SCOPED_TRACE(shared_scale ? "gate and up share a scale" : "gate and up with scales of their own");
    MoeWeights w(c, seed);
    std::vector<ops::Nvfp4Weight> qg, qu, qd;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const float g_scale = ops::nvfp4_global_scale_for(w.g[e]);
      const float u_scale = shared_scale ? std::max(g_scale, ops::nvfp4_global_scale_for(w.u[e])) : g_scale * 1.5f;
      qg.push_back(ops::nvfp4_quantize(w.g[e], shared_scale ? u_scale : g_scale));
      qu.push_back(ops::nvfp4_quantize(w.u[e], u_scale));
      qd.push_back(ops::nvfp4_quantize(w.d[e]));
      // The reference uses exactly the dequantized weights the module holds.
      w.g[e] = ops::nvfp4_dequantize(qg[e]);
      w.u[e] = ops::nvfp4_dequantize(qu[e]);
      w.d[e] = ops::nvfp4_dequantize(qd[e]);
    }
    Tensor x = randn({4, c.hidden_size}, DType::kBF16, seed + 1);
    Tensor y_off;
    for (int domains : {0, 2}) {
      SCOPED_TRACE(domains);
      MoE moe(make_ld(domains).ctx("mlp"), c);
      moe.load("gate.weight", w.gate);
      moe.load("gate.e_score_correction_bias", w.bias);
      for (int64_t e = 0; e < c.num_experts; ++e) {
        for (const auto& [proj, q] : {std::pair<const char*, ops::Nvfp4Weight*>{"gate_proj", &qg[e]},
                                      {"up_proj", &qu[e]}, {"down_proj", &qd[e]}}) {
          moe.load_expert(e, proj, "weight", q->packed);
          moe.load_expert(e, proj, "weight_scale", q->scales);
          moe.load_expert(e, proj, "weight_scale_2", fp32_scalar(q->global_scale));
        }
      }
      moe.localize();
      EXPECT_EQ(moe.experts_plan().enabled, domains == 2) << moe.experts_plan().describe();
      EXPECT_EQ(moe.expert_gate_up(0).per_half_scales(), !shared_scale);
      // Row blocks run where each expert is one NVFP4 weight per domain (or whole).
      EXPECT_EQ(moe.expert_gate_up(0).nvfp4_unit(domains == 2 ? 1 : -1) != nullptr, shared_scale);
      const Tensor y = run(moe, x);
      EXPECT_LT(rel_error(y, ref_moe(moe, x, w).v), bf16_gemm_tolerance(c.intermediate_size));
      if (domains == 0) y_off = y;
      else EXPECT_TRUE(bitwise_equal(y, y_off));
    }
  }
}

// Decode with at most one (token, choice) pair in 2 experts takes NVFP4 experts by id
// (ops::nvfp4_gemm_indexed; no offsets, no grouping), unpartitioned or per partition on its
// shards: the host profile shows no grouping region, and the output is bitwise what grouping the
// pairs by expert gives, and LD off's, and matches the reference. With more tokens the pairs are
// grouped either way.
TEST(MoeTest, Nvfp4DecodeTakesExpertsByIdAsGroupingWould) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  MoeConfig c = small_cfg(256, 256, 8, 1);  // NVFP4 partitions need 128-row multiples
  c.n_group = 1;
  c.topk_group = 1;
  c.expert_quant = locality::QuantKind::kNVFP4;
  c.shared_quant = locality::QuantKind::kNVFP4;
  MoeWeights w(c, seed);
  modules::WeightMap pieces{{"gate.weight", w.gate}, {"gate.e_score_correction_bias", w.bias}};
  auto add = [&](const std::string& prefix, Tensor* t, float global) {
    const ops::Nvfp4Weight q = ops::nvfp4_quantize(*t, global);
    pieces[prefix + "weight"] = q.packed;
    pieces[prefix + "weight_scale"] = q.scales;
    pieces[prefix + "weight_scale_2"] = fp32_scalar(q.global_scale);
    *t = ops::nvfp4_dequantize(q);  // the reference uses the weights the module holds
  };
  auto add_mlp = [&](const std::string& prefix, Tensor* g, Tensor* u, Tensor* d) {
    const float shared = std::max(ops::nvfp4_global_scale_for(*g), ops::nvfp4_global_scale_for(*u));
    add(prefix + "gate_proj.", g, shared);  // one scale: the fused weight is one NVFP4 unit
    add(prefix + "up_proj.", u, shared);
    add(prefix + "down_proj.", d, ops::nvfp4_global_scale_for(*d));
  };
  for (int64_t e = 0; e < c.num_experts; ++e) add_mlp(str("experts.", e, "."), &w.g[e], &w.u[e], &w.d[e]);
  add_mlp("shared_experts.", &w.sg, &w.su, &w.sd);
  const bool was = modules::moe_indexed_experts();
  const bool profiling = HostProfile::enabled();
  HostProfile::set_enabled(true);
  std::map<int64_t, Tensor> ld_off;  // by T
  for (const int domains : {0, 2}) {  // unpartitioned, then each partition on its shards
    SCOPED_TRACE(domains);
    MoE moe(make_ld(domains).ctx("mlp"), c);
    for (const auto& [k, v] : pieces) moe.load(k, v);
    moe.localize();
    ASSERT_EQ(moe.experts_plan().enabled, domains == 2) << moe.experts_plan().describe();
    for (const int64_t T : {1, 3}) {  // 2 pairs over 8 experts: by id; 6: grouped
      SCOPED_TRACE(T);
      const Tensor x = randn({T, c.hidden_size}, DType::kBF16, seed + 1 + T);
      modules::set_moe_indexed_experts(true);
      HostProfile::reset();
      const Tensor by_id = run(moe, x);
      EXPECT_EQ(HostProfile::report().find("moe.group") == std::string::npos, T == 1) << HostProfile::report();
      // One token, experts whole: the shared expert rides in the routed experts' launches.
      EXPECT_EQ(HostProfile::report().find("moe.shared") == std::string::npos, T == 1 && domains == 0)
          << HostProfile::report();
      modules::set_moe_indexed_experts(false);
      HostProfile::reset();
      const Tensor grouped = run(moe, x);
      EXPECT_NE(HostProfile::report().find("moe.group"), std::string::npos);
      EXPECT_TRUE(bitwise_equal(by_id, grouped));
      EXPECT_LT(rel_error(by_id, ref_moe(moe, x, w).v), bf16_gemm_tolerance(c.intermediate_size));
      if (domains == 0) ld_off[T] = by_id;
      else EXPECT_TRUE(bitwise_equal(by_id, ld_off[T]));
    }
  }
  HostProfile::set_enabled(profiling);
  HostProfile::reset();
  modules::set_moe_indexed_experts(was);
}

TEST(MoeTest, StrictModeRefusesAnUnpartitionableMoe) {
  MoeConfig c = small_cfg(36, 64, 4, 0);  // hidden 36: K not 8-aligned
  EXPECT_NO_THROW(MoE(make_ld(2).ctx("mlp"), c));
  EXPECT_FALSE(MoE(make_ld(2).ctx("mlp"), c).experts_plan().enabled);
  EXPECT_THROW(MoE(make_ld(2).ctx("mlp", true), c), Error);
  c.n_group = 3;
  EXPECT_THROW(MoE(make_ld(0).ctx("mlp"), c), Error);  // 3 groups do not divide 4 experts
}

}  // namespace
}  // namespace locus::testing
