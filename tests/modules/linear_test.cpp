// Linear: fp64 references, locality on (1, 2, 4 emulated domains) vs off bit for bit, the weight
// lifecycle (release, in-place reload, idempotence, validation before writing), NVFP4 weights
// (also gate/up with different global scales) and the planner guards.
#include "modules/linear.h"

#include <gtest/gtest.h>

#include "core/device_hooks.h"
#include "module_test_util.h"

namespace locus::testing {
namespace {

using locality::QuantKind;
using locality::WeightMode;
using modules::Linear;
using modules::LinearConfig;

LinearConfig cfg(int64_t k, int64_t n, WeightMode mode = WeightMode::kVanilla, bool bias = false,
                 QuantKind q = QuantKind::kBF16) {
  LinearConfig c;
  c.in_features = k;
  c.out_features = n;
  c.mode = mode;
  c.bias = bias;
  c.quant = q;
  return c;
}

Tensor run(const Linear& lin, const Tensor& x, DType out = DType::kBF16) {
  const int64_t n = lin.out_features();
  Tensor y = Tensor::empty({x.size(0), n}, out);
  y.fill_nan_();
  lin.forward(x, y);
  return y;
}

TEST(LinearTest, Bf16VanillaWithBiasMatchesFp64Reference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 7, K = 48, N = 40;
  Tensor x = randn({M, K}, DType::kBF16, seed), w = randn({N, K}, DType::kBF16, seed + 1);
  Tensor b = randn({N}, DType::kFP32, seed + 2);
  Linear lin(make_ld(0).ctx("model.layers.0.proj"), cfg(K, N, WeightMode::kVanilla, true));
  lin.load("weight", w);
  lin.load("bias", b);
  lin.transform();
  const Mat ref = ref_linear(Mat(x), Mat(w), to_doubles(b));
  EXPECT_LT(rel_error(run(lin, x), ref.v), bf16_gemm_tolerance(K));
  EXPECT_LT(rel_error(run(lin, x, DType::kFP32), ref.v), fp32_out_gemm_tolerance(K));
  EXPECT_FALSE(lin.plan().enabled);
  EXPECT_NE(lin.plan().reason.find("no planner"), std::string::npos) << lin.plan().reason;
}

TEST(LinearTest, FusedGateUpStagedLoadMatchesSwigluReference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 5, K = 32, I = 24;
  Tensor x = randn({M, K}, DType::kBF16, seed), g = randn({I, K}, DType::kBF16, seed + 1),
         u = randn({I, K}, DType::kFP32, seed + 2);  // fp32 pieces are rounded to bf16 on load
  Linear lin(make_ld(0).ctx("mlp.gate_up_proj"), cfg(K, I, WeightMode::kFusedGateUp));
  EXPECT_EQ(lin.missing_pieces(), (std::vector<std::string>{"gate", "up"}));
  lin.load("gate", g);
  EXPECT_EQ(lin.state(), modules::LifecycleState::kEmpty);
  EXPECT_EQ(lin.missing_pieces(), std::vector<std::string>{"up"});
  try {
    lin.transform();
    ADD_FAILURE() << "transform() with a missing piece must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing: up"), std::string::npos) << e.what();
  }
  lin.load("up.weight", u);
  EXPECT_EQ(lin.state(), modules::LifecycleState::kLoaded);
  lin.transform();
  Tensor u16 = Tensor::empty({I, K}, DType::kBF16);
  for (int64_t i = 0; i < u.numel(); ++i) set(u16, i, get(u, i));
  const Mat ref = ref_swiglu(Mat(x), Mat(g), Mat(u16));
  EXPECT_LT(rel_error(run(lin, x), ref.v), bf16_gemm_tolerance(K));
  // The unfused path rounds once from fp32 too: bit-identical on the CPU.
  Tensor y2 = Tensor::empty({M, I}, DType::kBF16);
  y2.fill_nan_();
  lin.forward_unfused(x, y2);
  EXPECT_TRUE(bitwise_equal(run(lin, x), y2));
}

// One module per domain count; LD on must reproduce LD off exactly.
TEST(LinearTest, LocalityOnMatchesOffBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 6, K = 64, N = 64;
  Tensor x = randn({M, K}, DType::kBF16, seed), w = randn({N, K}, DType::kBF16, seed + 1);
  Tensor b = randn({N}, DType::kBF16, seed + 2);
  Tensor g = randn({N, K}, DType::kBF16, seed + 3), u = randn({N, K}, DType::kBF16, seed + 4);
  auto build = [&](const LdSetup& ld, WeightMode mode) {
    auto lin = std::make_unique<Linear>(ld.ctx("model.layers.1.mlp.proj"), cfg(K, N, mode, mode == WeightMode::kVanilla));
    if (mode == WeightMode::kVanilla) {
      lin->load("weight", w);
      lin->load("bias", b);
    } else {
      lin->load("up", u);  // pieces in any order
      lin->load("gate", g);
    }
    lin->transform();
    lin->localize();
    return lin;
  };
  for (WeightMode mode : {WeightMode::kVanilla, WeightMode::kFusedGateUp}) {
    auto off = build(make_ld(0), mode);
    const Tensor y_off = run(*off, x), y_off32 = run(*off, x, DType::kFP32);
    for (int domains : {1, 2, 4}) {
      SCOPED_TRACE(::testing::Message() << "domains " << domains << " mode " << locality::weight_mode_name(mode));
      auto on = build(make_ld(domains), mode);
      EXPECT_EQ(on->partitioned(), domains > 1) << on->plan().describe();
      EXPECT_EQ(on->num_partitions(), domains);
      EXPECT_TRUE(bitwise_equal(run(*on, x), y_off));
      EXPECT_TRUE(bitwise_equal(run(*on, x, DType::kFP32), y_off32));
      if (mode == WeightMode::kFusedGateUp) {
        Tensor y = Tensor::empty({M, N}, DType::kBF16);
        y.fill_nan_();
        on->forward_unfused(x, y);
        EXPECT_TRUE(bitwise_equal(y, y_off));
      }
      if (domains == 1) {
        EXPECT_NE(on->plan().reason.find("1 locality domain"), std::string::npos) << on->plan().reason;
      }
    }
  }
}

TEST(LinearTest, LocalizeReleasesFullWeightIntoDomainShards) {
  const uint64_t seed = fresh_seed();
  const int64_t K = 32, N = 48;  // 3 blocks of 16 rows: partition 0 gets 32 rows, partition 1 16
  LdSetup ld = make_ld(2);
  Linear lin(ld.ctx("proj"), cfg(K, N, WeightMode::kVanilla, true));
  lin.load("weight", randn({N, K}, DType::kBF16, seed));
  lin.load("bias", randn({N}, DType::kBF16, seed + 1));
  lin.transform();
  const int64_t full = N * K * 2, bias = N * 2;
  EXPECT_EQ(lin.memory().total_bytes, full + bias);
  EXPECT_EQ(lin.memory().domain_bytes(-1), full + bias);
  const int64_t live_none = memory_stats(Device::cpu(), -1).live_bytes;
  const int64_t live0 = memory_stats(Device::cpu(), 0).live_bytes, live1 = memory_stats(Device::cpu(), 1).live_bytes;
  lin.localize();
  ASSERT_TRUE(lin.partitioned()) << lin.plan().describe();
  EXPECT_FALSE(lin.weight().defined());
  ASSERT_EQ(lin.shards().size(), 2u);
  EXPECT_EQ(lin.shards()[0].domain(), 0);
  EXPECT_EQ(lin.shards()[1].domain(), 1);
  const int64_t rows0 = lin.plan().layout.parts[0].rows(), rows1 = lin.plan().layout.parts[1].rows();
  EXPECT_EQ(rows0 + rows1, N);
  // The module's accounting and the allocator's agree: the full weight's bytes were returned.
  EXPECT_EQ(memory_stats(Device::cpu(), -1).live_bytes, live_none - full);
  EXPECT_EQ(memory_stats(Device::cpu(), 0).live_bytes, live0 + rows0 * K * 2);
  EXPECT_EQ(memory_stats(Device::cpu(), 1).live_bytes, live1 + rows1 * K * 2);
  const modules::MemoryUsage m = lin.memory();
  EXPECT_EQ(m.domain_bytes(-1), bias);
  EXPECT_EQ(m.domain_bytes(0), rows0 * K * 2);
  EXPECT_EQ(m.domain_bytes(1), rows1 * K * 2);
  EXPECT_EQ(m.total_bytes, full + bias);
  // Localizing again changes nothing.
  const auto ptrs = lin.weight_data_ptrs();
  lin.localize();
  lin.transform();
  EXPECT_EQ(lin.weight_data_ptrs(), ptrs);
  EXPECT_EQ(memory_stats(Device::cpu(), -1).live_bytes, live_none - full);
  EXPECT_EQ(lin.memory().total_bytes, full + bias);
}

TEST(LinearTest, ReloadRewritesShardsInPlace) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 4, K = 32, I = 32;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  Tensor g1 = randn({I, K}, DType::kBF16, seed + 1), u1 = randn({I, K}, DType::kBF16, seed + 2);
  Tensor g2 = randn({I, K}, DType::kBF16, seed + 3), u2 = randn({I, K}, DType::kBF16, seed + 4);
  Linear lin(make_ld(2).ctx("mlp.gate_up_proj"), cfg(K, I, WeightMode::kFusedGateUp));
  lin.load("gate", g1);
  lin.load("up", u1);
  lin.localize();  // transforms first
  ASSERT_TRUE(lin.partitioned());
  const Tensor y1 = run(lin, x);
  const auto ptrs = lin.weight_data_ptrs();
  const int64_t live = live_bytes_total(Device::cpu());

  lin.reload({{"gate", g2}, {"up", u2}});
  EXPECT_EQ(live_bytes_total(Device::cpu()), live);  // nothing new is held
  EXPECT_EQ(lin.weight_data_ptrs(), ptrs);
  const Tensor y2 = run(lin, x);
  EXPECT_FALSE(bitwise_equal(y1, y2));
  EXPECT_LT(rel_error(y2, ref_swiglu(Mat(x), Mat(g2), Mat(u2)).v), bf16_gemm_tolerance(K));
  Tensor gathered = lin.gather_weight();
  EXPECT_TRUE(bitwise_equal(gathered.slice(0, 0, I), g2));
  EXPECT_TRUE(bitwise_equal(gathered.slice(0, I, 2 * I), u2));

  // Reload with the same weights (and in the fused [2I, K] form): nothing changes.
  lin.reload({{"weight", gathered}});
  EXPECT_TRUE(bitwise_equal(run(lin, x), y2));
  EXPECT_EQ(lin.weight_data_ptrs(), ptrs);
}

TEST(LinearTest, ReloadWithBadWeightsIsAnErrorAndKeepsTheOldWeights) {
  const uint64_t seed = fresh_seed();
  const int64_t M = 3, K = 32, N = 32;
  Tensor x = randn({M, K}, DType::kBF16, seed), w = randn({N, K}, DType::kBF16, seed + 1);
  Tensor b = randn({N}, DType::kBF16, seed + 2);
  for (int domains : {0, 2}) {
    SCOPED_TRACE(domains);
    Linear lin(make_ld(domains).ctx("layers.2.o_proj"), cfg(K, N, WeightMode::kVanilla, true));
    lin.load("weight", w);
    lin.load("bias", b);
    lin.localize();
    const Tensor y = run(lin, x);
    auto expect_error = [&](const modules::WeightMap& m, const std::string& needle) {
      try {
        lin.reload(m);
        ADD_FAILURE() << "reload must throw (" << needle << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("layers.2.o_proj"), std::string::npos) << e.what();
      }
      EXPECT_TRUE(bitwise_equal(run(lin, x), y));
    };
    Tensor w_new = randn({N, K}, DType::kBF16, seed + 3);
    // A good weight with a bad bias: nothing at all may be written.
    expect_error({{"weight", w_new}, {"bias", randn({N + 1}, DType::kBF16, seed)}}, "'bias' must be");
    expect_error({{"weight", randn({N, K + 8}, DType::kBF16, seed)}, {"bias", b}}, "[32, 40]");
    expect_error({{"weight", Tensor::zeros({N, K}, DType::kI32)}, {"bias", b}}, "i32");
    expect_error({{"bias", b}}, "missing pieces: weight");
    expect_error({{"weight", w_new}, {"bias", b}, {"weights", w_new}}, "unknown weight piece 'weights'");
  }
}

TEST(LinearTest, BadConfigurationsAndCallsAreClearErrors) {
  LdSetup off = make_ld(0);
  EXPECT_THROW(Linear(off.ctx("a"), cfg(32, 32, WeightMode::kFusedQkv)), Error);
  EXPECT_THROW(Linear(off.ctx("a"), cfg(32, 32, WeightMode::kVanilla, false, QuantKind::kFP8)), Error);
  EXPECT_THROW(Linear(off.ctx("a"), cfg(0, 32)), Error);
  EXPECT_THROW(Linear(off.ctx("a"), cfg(24, 32, WeightMode::kVanilla, false, QuantKind::kNVFP4)), Error);  // K % 16
  Linear lin(off.ctx("a"), cfg(32, 16));
  Tensor x = randn({2, 32}, DType::kBF16, 1);
  Tensor y = Tensor::empty({2, 16}, DType::kBF16);
  EXPECT_THROW(lin.forward(x, y), Error);  // not transformed
  EXPECT_THROW(lin.load("weight", randn({16, 31}, DType::kBF16, 1)), Error);
  EXPECT_THROW(lin.load("gate", randn({16, 32}, DType::kBF16, 1)), Error);  // VANILLA has no gate
  lin.load("weight", randn({16, 32}, DType::kBF16, 1));
  lin.transform();
  EXPECT_THROW(lin.load("weight", randn({16, 32}, DType::kBF16, 1)), Error);  // use reload
  EXPECT_THROW(lin.forward(randn({2, 16}, DType::kBF16, 1), y), Error);       // wrong K
}

// ---------------------------------------------------------------------------------------------
// NVFP4

TEST(LinearTest, Nvfp4MatchesDequantizedReferenceAndLocalityIsBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 5, K = 64, N = 256;  // 2 partitions of 128 rows (NVFP4 row alignment)
  Tensor x = randn({M, K}, DType::kBF16, seed);
  ops::Nvfp4Weight q = ops::nvfp4_quantize(randn({N, K}, DType::kFP32, seed + 1));
  Tensor b = randn({N}, DType::kFP32, seed + 2);
  const Mat ref = ref_linear(Mat(x), Mat(ops::nvfp4_dequantize(q)), to_doubles(b));
  Tensor y_off;
  for (int domains : {0, 2}) {
    SCOPED_TRACE(domains);
    Linear lin(make_ld(domains).ctx("mlp.down_proj"), cfg(K, N, WeightMode::kVanilla, true, QuantKind::kNVFP4));
    load_nvfp4(lin, "", q);
    lin.load("input_scale", fp32_scalar(1.f));  // accepted, ignored (weight-only)
    lin.load("bias", b);
    lin.transform();
    const int64_t live_none = memory_stats(Device::cpu(), -1).live_bytes;
    const int64_t held = lin.memory().domain_bytes(-1);
    lin.localize();
    EXPECT_EQ(lin.partitioned(), domains == 2) << lin.plan().describe();
    if (domains == 2) {
      // Packed weights and scales moved into the domains; only the bias stays outside.
      EXPECT_EQ(lin.memory().domain_bytes(-1), N * 4);
      EXPECT_EQ(memory_stats(Device::cpu(), -1).live_bytes, live_none - (held - N * 4));
      EXPECT_EQ(lin.memory().domain_bytes(0), 128 * (K / 2 + K / 16));
    }
    const Tensor y = run(lin, x);
    EXPECT_LT(rel_error(y, ref.v), bf16_gemm_tolerance(K));
    if (domains == 0) y_off = y;
    else EXPECT_TRUE(bitwise_equal(y, y_off));
  }
}

// Gate and up quantized with their own global scales (as vLLM warns happens): the module keeps
// one scale per half and stays exact; with a shared scale it uses the fused epilogue.
TEST(LinearTest, Nvfp4FusedGateUpWithDifferentGlobalScales) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 4, K = 64, I = 256;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  for (bool shared_scale : {false, true}) {
    SCOPED_TRACE(shared_scale);
    Tensor gw = randn({I, K}, DType::kFP32, seed + 1), uw = randn({I, K}, DType::kFP32, seed + 2, 3.0);
    ops::Nvfp4Weight gq, uq;
    if (shared_scale) {
      const float s = std::max(ops::nvfp4_global_scale_for(gw), ops::nvfp4_global_scale_for(uw));
      gq = ops::nvfp4_quantize(gw, s);
      uq = ops::nvfp4_quantize(uw, s);
    } else {
      gq = ops::nvfp4_quantize(gw);
      uq = ops::nvfp4_quantize(uw);
      ASSERT_NE(gq.global_scale, uq.global_scale);
    }
    const Mat ref = ref_swiglu(Mat(x), Mat(ops::nvfp4_dequantize(gq)), Mat(ops::nvfp4_dequantize(uq)));
    Tensor y_off;
    for (int domains : {0, 2}) {
      SCOPED_TRACE(domains);
      Linear lin(make_ld(domains).ctx("mlp.gate_up_proj"), cfg(K, I, WeightMode::kFusedGateUp, false, QuantKind::kNVFP4));
      load_nvfp4(lin, "up.", uq);
      load_nvfp4(lin, "gate.", gq);
      lin.transform();
      EXPECT_EQ(lin.per_half_scales(), !shared_scale);
      lin.localize();
      EXPECT_EQ(lin.partitioned(), domains == 2) << lin.plan().describe();
      const Tensor y = run(lin, x);
      EXPECT_LT(rel_error(y, ref.v), bf16_gemm_tolerance(K));
      if (domains == 0) y_off = y;
      else EXPECT_TRUE(bitwise_equal(y, y_off));
      // Reload keeps pointers; changing shared <-> separate scales is refused before writing.
      const auto ptrs = lin.weight_data_ptrs();
      lin.reload({{"gate.weight", gq.packed}, {"gate.weight_scale", gq.scales}, {"gate.weight_scale_2", fp32_scalar(gq.global_scale)},
                  {"up.weight", uq.packed}, {"up.weight_scale", uq.scales}, {"up.weight_scale_2", fp32_scalar(uq.global_scale)}});
      EXPECT_EQ(lin.weight_data_ptrs(), ptrs);
      EXPECT_TRUE(bitwise_equal(run(lin, x), y));
      const float other = shared_scale ? uq.global_scale * 2.f : gq.global_scale;
      EXPECT_THROW(lin.reload({{"gate.weight", gq.packed}, {"gate.weight_scale", gq.scales},
                               {"gate.weight_scale_2", fp32_scalar(gq.global_scale)}, {"up.weight", uq.packed},
                               {"up.weight_scale", uq.scales}, {"up.weight_scale_2", fp32_scalar(other)}}),
                   Error);
      EXPECT_TRUE(bitwise_equal(run(lin, x), y));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// guards

TEST(LinearTest, UnsupportedCombinationsFallBackWithReasonOrErrorWhenRequired) {
  const uint64_t seed = fresh_seed();
  const int64_t K = 64, N = 64;
  LdSetup no_nvfp4 = make_ld(2, [](locality::LocalityDomainPolicy& p) { p.allowed_ops.erase(locality::OpKind::kNvfp4Linear); });
  {
    Linear lin(no_nvfp4.ctx("mlp.up"), cfg(K, N * 2, WeightMode::kVanilla, false, QuantKind::kNVFP4));
    EXPECT_FALSE(lin.plan().enabled);
    EXPECT_NE(lin.plan().reason.find("allowed_ops"), std::string::npos) << lin.plan().reason;
    // Falls back to the unpartitioned kernel and still computes.
    ops::Nvfp4Weight q = ops::nvfp4_quantize(randn({N * 2, K}, DType::kFP32, seed));
    load_nvfp4(lin, "", q);
    lin.localize();
    EXPECT_FALSE(lin.partitioned());
    Tensor x = randn({2, K}, DType::kBF16, seed + 1);
    EXPECT_LT(rel_error(run(lin, x), ref_linear(Mat(x), Mat(ops::nvfp4_dequantize(q))).v), bf16_gemm_tolerance(K));
  }
  try {
    Linear lin(no_nvfp4.ctx("mlp.up", /*strict=*/true), cfg(K, N * 2, WeightMode::kVanilla, false, QuantKind::kNVFP4));
    ADD_FAILURE() << "strict mode must refuse an unsupported combination";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nvfp4"), std::string::npos) << m;
    EXPECT_NE(m.find("VANILLA"), std::string::npos) << m;
    EXPECT_NE(m.find("allowed_ops"), std::string::npos) << m;
  }
  // K not aligned for bf16 (36 % 8 != 0): fallback with the planner's reason, error when required.
  LdSetup ld = make_ld(2);
  Linear odd(ld.ctx("attn.proj"), cfg(36, N));
  EXPECT_FALSE(odd.plan().enabled);
  EXPECT_NE(odd.plan().reason.find("K=36"), std::string::npos) << odd.plan().reason;
  EXPECT_THROW(Linear(ld.ctx("attn.proj", true), cfg(36, N)), Error);
  // Excluded by the policy and never-partitioned modules are not errors in strict mode.
  Linear shared(ld.ctx("model.layers.3.mlp.shared_experts.gate_up_proj", true), cfg(K, N, WeightMode::kFusedGateUp));
  EXPECT_NE(shared.plan().reason.find("excluded"), std::string::npos) << shared.plan().reason;
  LinearConfig never = cfg(K, N);
  never.partitionable = false;
  never.unpartitioned_reason = "kept whole on purpose";
  Linear whole(ld.ctx("x", true), never);
  EXPECT_EQ(whole.plan().reason, "kept whole on purpose");
  std::vector<modules::PlanRecord> plans;
  whole.collect_plans(&plans);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_NE(plans[0].describe().find("kept whole on purpose"), std::string::npos);
}

}  // namespace
}  // namespace locus::testing

namespace locus::testing {
namespace {

// When the fused gate/up split is refused for its shape, [gate | up] is split as plain rows and
// SwiGLU runs after the join (the unfused fallback); the result stays bit-identical to LD off.
TEST(LinearTest, RefusedFusedSplitFallsBackToUnfusedRowSplit) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  {
    const int64_t M = 5, K = 32, I = 24;  // 24 rows cannot be split in 16-row blocks; 48 can: [0,32) [32,48)
    Tensor x = randn({M, K}, DType::kBF16, seed), g = randn({I, K}, DType::kBF16, seed + 1), u = randn({I, K}, DType::kBF16, seed + 2);
    Tensor y_off;
    for (int domains : {0, 2}) {
      Linear lin(make_ld(domains).ctx("mlp.gate_up_proj"), cfg(K, I, WeightMode::kFusedGateUp));
      EXPECT_EQ(lin.unfused_split(), domains == 2) << lin.plan().describe();
      if (domains == 2) {
        EXPECT_NE(lin.plan().reason.find("fused gate/up split refused"), std::string::npos) << lin.plan().reason;
        EXPECT_EQ(lin.plan().layout.parts[0].n1, 32);
      }
      lin.load("gate", g);
      lin.load("up", u);
      lin.localize();
      EXPECT_EQ(lin.partitioned(), domains == 2);
      const Tensor y = run(lin, x);
      EXPECT_LT(rel_error(y, ref_swiglu(Mat(x), Mat(g), Mat(u)).v), bf16_gemm_tolerance(K));
      if (domains == 0) y_off = y;
      else EXPECT_TRUE(bitwise_equal(y, y_off));
    }
  }
  // NVFP4: I = 128 gives 64-row fused partitions (refused, 128 needed); 2I = 256 splits as
  // [gate | up] exactly, so even separate global scales work. I = 192 straddles the boundary.
  for (int64_t I : {128, 192}) {
    for (bool shared_scale : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "I " << I << " shared " << shared_scale);
      const int64_t M = 3, K = 64;
      Tensor x = randn({M, K}, DType::kBF16, seed + 3);
      Tensor gw = randn({I, K}, DType::kFP32, seed + 4), uw = randn({I, K}, DType::kFP32, seed + 5);
      const ops::Nvfp4Weight gq = ops::nvfp4_quantize(gw);
      const ops::Nvfp4Weight uq = ops::nvfp4_quantize(uw, shared_scale ? gq.global_scale : gq.global_scale * 1.5f);
      const Mat ref = ref_swiglu(Mat(x), Mat(ops::nvfp4_dequantize(gq)), Mat(ops::nvfp4_dequantize(uq)));
      Tensor y_off;
      for (int domains : {0, 2}) {
        Linear lin(make_ld(domains).ctx("mlp.gate_up_proj"), cfg(K, I, WeightMode::kFusedGateUp, false, QuantKind::kNVFP4));
        load_nvfp4(lin, "gate.", gq);
        load_nvfp4(lin, "up.", uq);
        lin.transform();
        const bool expect_split = domains == 2 && (I == 128 || shared_scale);
        EXPECT_EQ(lin.plan().enabled, expect_split) << lin.plan().describe();
        if (domains == 2 && !expect_split) {
          EXPECT_NE(lin.plan().reason.find("straddles"), std::string::npos) << lin.plan().reason;
        }
        lin.localize();
        const Tensor y = run(lin, x);
        EXPECT_LT(rel_error(y, ref.v), bf16_gemm_tolerance(K));
        if (domains == 0) {
          y_off = y;
          continue;
        }
        EXPECT_TRUE(bitwise_equal(y, y_off));
        const auto ptrs = lin.weight_data_ptrs();
        lin.reload({{"gate.weight", gq.packed}, {"gate.weight_scale", gq.scales}, {"gate.weight_scale_2", fp32_scalar(gq.global_scale)},
                    {"up.weight", uq.packed}, {"up.weight_scale", uq.scales}, {"up.weight_scale_2", fp32_scalar(uq.global_scale)}});
        lin.rebuild();
        EXPECT_EQ(lin.weight_data_ptrs(), ptrs);
        EXPECT_TRUE(bitwise_equal(run(lin, x), y_off));
      }
    }
  }
}

}  // namespace
}  // namespace locus::testing
