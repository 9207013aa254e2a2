// Planner: every rule of DESIGN.md section 3, one at a time, with its reason string.
#include "locality/planner.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace locus::locality {
namespace {

LocalityDomainPolicy on() {
  LocalityDomainPolicy p;
  p.enabled = true;
  return p;
}

Topology domains(int n) { return cpu_topology(8, n, "test"); }

Planner planner(int n, LocalityDomainPolicy policy = on()) { return Planner(std::move(policy), domains(n)); }

const char* kQ = "model.layers.0.self_attn.q_b_proj";

std::vector<std::pair<int64_t, int64_t>> ranges(const PartitionedLayout& l) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& r : l.parts) out.emplace_back(r.n0, r.n1);
  return out;
}
using R = std::vector<std::pair<int64_t, int64_t>>;

// ---- plan_linear ---------------------------------------------------------------------------

TEST(Planner, DefaultPolicyIsOffWithReason) {
  LocalityDomainPolicy def;
  EXPECT_FALSE(def.enabled);
  Planner pl(def, domains(2));
  for (QuantKind q : {QuantKind::kBF16, QuantKind::kNVFP4, QuantKind::kFP8}) {
    Plan p = pl.plan_linear(kQ, 7168, 7168, q, WeightMode::kVanilla);
    EXPECT_FALSE(p.enabled);
    EXPECT_EQ(p.reason, "locality domains are disabled by the policy (enable with --enable-locality-domains)");
    EXPECT_EQ(p.layout.num_partitions(), 0);
  }
  EXPECT_FALSE(pl.plan_bmm("bmm", 128, 128, 512).enabled);
  EXPECT_FALSE(pl.plan_moe("model.layers.3.mlp.experts", 256, 7168, 2048, QuantKind::kBF16).enabled);
  EXPECT_EQ(pl.plan_linear(kQ, 7168, 7168, QuantKind::kBF16, WeightMode::kVanilla).describe(),
            "not partitioned: locality domains are disabled by the policy (enable with --enable-locality-domains)");
}

TEST(Planner, OneDomainTopologyHasNothingToSplit) {
  Plan p = planner(1).plan_linear(kQ, 7168, 7168, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_FALSE(p.enabled);
  EXPECT_EQ(p.reason, "only 1 locality domain (topology from test) and policy num_partitions is not above 1: nothing to split across");
}

TEST(Planner, NumPartitionsOverridesOneDomainTopology) {
  LocalityDomainPolicy pol = on();
  pol.num_partitions = 2;
  Planner pl(pol, domains(1));
  EXPECT_EQ(pl.partitions(), 2);
  Plan p = pl.plan_linear(kQ, 7168, 7168, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_TRUE(p.enabled) << p.reason;
  EXPECT_EQ(p.num_partitions, 2);
  pol.num_partitions = 3;
  EXPECT_EQ(Planner(pol, domains(2)).partitions(), 3);
  pol.num_partitions = 0;
  EXPECT_EQ(Planner(pol, domains(4)).partitions(), 4);
  pol.num_partitions = 1;  // explicitly one partition on a 2-domain topology
  EXPECT_EQ(Planner(pol, domains(2)).plan_linear(kQ, 7168, 7168, QuantKind::kBF16, WeightMode::kVanilla).reason,
            "policy num_partitions=1: nothing to split across");
}

TEST(Planner, Fp8IsRefused) {
  Plan p = planner(2).plan_linear(kQ, 7168, 7168, QuantKind::kFP8, WeightMode::kVanilla);
  EXPECT_FALSE(p.enabled);
  EXPECT_EQ(p.reason, "quantization fp8 is not supported by locality-domain Linear (supported: bf16, nvfp4)");
}

TEST(Planner, OpKindMustBeAllowed) {
  LocalityDomainPolicy pol = on();
  pol.allowed_ops = {OpKind::kBf16Bmm, OpKind::kNvfp4Linear};
  Planner pl(pol, domains(2));
  Plan p = pl.plan_linear(kQ, 7168, 7168, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_FALSE(p.enabled);
  EXPECT_EQ(p.reason, "op bf16_linear is not in the policy's allowed_ops {nvfp4_linear, bf16_bmm}");
  Plan q = pl.plan_linear(kQ, 7168, 7168, QuantKind::kNVFP4, WeightMode::kVanilla);
  EXPECT_TRUE(q.enabled) << q.reason;
  EXPECT_EQ(q.op, OpKind::kNvfp4Linear);
}

TEST(Planner, ExcludedModulesStayWhole) {
  Planner pl = planner(2);
  Plan lm = pl.plan_linear("lm_head", 7168, 129280, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_EQ(lm.reason, "module 'lm_head' is excluded by policy pattern 'lm_head'");
  Plan gate = pl.plan_linear("model.layers.3.mlp.gate", 7168, 256, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_EQ(gate.reason, "module 'model.layers.3.mlp.gate' is excluded by policy pattern '*.mlp.gate'");
  Plan shared = pl.plan_linear("model.layers.3.mlp.shared_experts.gate_up_proj", 7168, 2048, QuantKind::kBF16,
                               WeightMode::kFusedGateUp);
  EXPECT_EQ(shared.reason,
            "module 'model.layers.3.mlp.shared_experts.gate_up_proj' is excluded by policy pattern '*shared_experts*'");
  // The router pattern must not catch the dense MLP's gate_up_proj.
  EXPECT_TRUE(pl.plan_linear("model.layers.0.mlp.gate_up_proj", 7168, 18432, QuantKind::kBF16,
                             WeightMode::kFusedGateUp).enabled);
  LocalityDomainPolicy none = on();
  none.exclude_modules.clear();
  EXPECT_TRUE(Planner(none, domains(2)).plan_linear("lm_head", 7168, 129280, QuantKind::kBF16, WeightMode::kVanilla).enabled);
}

TEST(Planner, FusedQkvIsRefused) {
  Plan p = planner(2).plan_linear(kQ, 7168, 7168, QuantKind::kBF16, WeightMode::kFusedQkv);
  EXPECT_FALSE(p.enabled);
  EXPECT_EQ(p.reason, "weight mode FUSED_QKV is not supported (supported: VANILLA, FUSED_GATE_UP)");
}

TEST(Planner, KAlignmentBf16AndNvfp4) {
  Planner pl = planner(2);
  Plan b = pl.plan_linear(kQ, 7169, 7168, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_EQ(b.reason, "in_features K=7169 is not a multiple of 8 (bf16 rows need 16-byte alignment)");
  EXPECT_TRUE(pl.plan_linear(kQ, 7176, 7168, QuantKind::kBF16, WeightMode::kVanilla).enabled);
  Plan n = pl.plan_linear(kQ, 2064, 7168, QuantKind::kNVFP4, WeightMode::kVanilla);
  EXPECT_EQ(n.reason, "in_features K=2064 is not a multiple of 32 (NVFP4 packed-K alignment: 16-byte rows)");
  EXPECT_TRUE(pl.plan_linear(kQ, 2048, 7168, QuantKind::kNVFP4, WeightMode::kVanilla).enabled);
}

TEST(Planner, NSplitMustBePaddingFree) {
  Planner pl = planner(2);
  Plan b = pl.plan_linear(kQ, 7168, 2114, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_EQ(b.reason, "out_features: N=2114 is not a multiple of the 16-row alignment (the split would need padding)");
  Plan ok = pl.plan_linear(kQ, 7168, 2112, QuantKind::kBF16, WeightMode::kVanilla);
  ASSERT_TRUE(ok.enabled) << ok.reason;
  EXPECT_EQ(ranges(ok.layout), (R{{0, 1056}, {1056, 2112}}));
  // NVFP4: 7200 is a multiple of 32 but not of 128 scale rows.
  Plan n = pl.plan_linear(kQ, 7168, 7200, QuantKind::kNVFP4, WeightMode::kVanilla);
  EXPECT_EQ(n.reason, "out_features: N=7200 is not a multiple of the 128-row alignment (the split would need padding)");
  Plan tiny = pl.plan_linear(kQ, 7168, 16, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_EQ(tiny.reason,
            "out_features: N=16 splits into 1 block of 16 rows, fewer than the 2 partitions (a partition would be empty)");
}

TEST(Planner, FusedGateUpKeepsGateAndUpTogether) {
  Planner pl = planner(2);
  Plan p = pl.plan_linear("model.layers.0.mlp.gate_up_proj", 7168, 18432, QuantKind::kBF16, WeightMode::kFusedGateUp);
  ASSERT_TRUE(p.enabled) << p.reason;
  EXPECT_TRUE(p.layout.fused_gate_up);
  EXPECT_EQ(p.layout.n, 18432);
  EXPECT_EQ(ranges(p.layout), (R{{0, 9216}, {9216, 18432}}));
  EXPECT_EQ(p.layout.weight_rows(1), 18432);
  Plan bad = pl.plan_linear("model.layers.0.mlp.gate_up_proj", 7168, 24, QuantKind::kBF16, WeightMode::kFusedGateUp);
  EXPECT_EQ(bad.reason,
            "intermediate size (FUSED_GATE_UP): N=24 is not a multiple of the 16-row alignment (the split would need padding)");
}

TEST(Planner, EnabledPlanFieldsAndAnyDomainCount) {
  for (int d : {2, 3, 4}) {
    Plan p = planner(d).plan_linear(kQ, 7168, 7168, QuantKind::kNVFP4, WeightMode::kVanilla);
    ASSERT_TRUE(p.enabled) << p.reason;
    EXPECT_EQ(p.reason, "");
    EXPECT_EQ(p.op, OpKind::kNvfp4Linear);
    EXPECT_EQ(p.module, kQ);
    EXPECT_EQ(p.num_partitions, d);
    EXPECT_EQ(p.layout.num_partitions(), d);
    EXPECT_EQ(p.layout.align, kNvfp4RowAlign);
    EXPECT_EQ(p.layout.parts.back().n1, 7168);
  }
  Plan two = planner(2).plan_linear(kQ, 7168, 7168, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_EQ(two.describe(), "partitioned 2 x [0,3584) [3584,7168)");
  EXPECT_EQ(two.op, OpKind::kBf16Linear);
  EXPECT_EQ(two.layout.align, kBf16RowAlign);
}

TEST(Planner, BadShapesThrow) {
  EXPECT_THROW(planner(2).plan_linear(kQ, 0, 7168, QuantKind::kBF16, WeightMode::kVanilla), Error);
  EXPECT_THROW(planner(2).plan_bmm("bmm", 128, -1, 512), Error);
  EXPECT_THROW(planner(2).plan_moe("moe", 0, 7168, 2048, QuantKind::kBF16), Error);
}

// ---- plan_bmm ------------------------------------------------------------------------------

TEST(Planner, BmmSplitsHeads) {
  Plan p = planner(2).plan_bmm("model.layers.0.self_attn.k_b_absorbed", 128, 128, 512);
  ASSERT_TRUE(p.enabled) << p.reason;
  EXPECT_EQ(p.op, OpKind::kBf16Bmm);
  EXPECT_EQ(ranges(p.layout), (R{{0, 64}, {64, 128}}));
  Plan three = planner(3).plan_bmm("bmm", 128, 512, 128);
  ASSERT_TRUE(three.enabled) << three.reason;
  EXPECT_EQ(ranges(three.layout), (R{{0, 43}, {43, 86}, {86, 128}}));
}

TEST(Planner, BmmRules) {
  EXPECT_EQ(planner(2).plan_bmm("bmm", 128, 127, 512).reason,
            "bmm K=127 is not a multiple of 8 (bf16 rows need 16-byte alignment)");
  EXPECT_EQ(planner(2).plan_bmm("bmm", 128, 128, 100).reason,
            "bmm N=100 is not a multiple of 8 (bf16 output rows need 16-byte alignment)");
  EXPECT_EQ(planner(4).plan_bmm("bmm", 3, 128, 512).reason,
            "heads=3 are fewer than the 4 partitions (a partition would get no head)");
  LocalityDomainPolicy pol = on();
  pol.allowed_ops = {OpKind::kBf16Linear};
  EXPECT_EQ(Planner(pol, domains(2)).plan_bmm("bmm", 128, 128, 512).reason,
            "op bf16_bmm is not in the policy's allowed_ops {bf16_linear}");
  pol = on();
  pol.exclude_modules = {"*absorbed*"};
  EXPECT_EQ(Planner(pol, domains(2)).plan_bmm("layers.0.k_absorbed", 128, 128, 512).reason,
            "module 'layers.0.k_absorbed' is excluded by policy pattern '*absorbed*'");
  EXPECT_EQ(planner(1).plan_bmm("bmm", 128, 128, 512).reason,
            "only 1 locality domain (topology from test) and policy num_partitions is not above 1: nothing to split across");
}

// ---- plan_moe ------------------------------------------------------------------------------

const char* kE = "model.layers.3.mlp.experts";

TEST(Planner, MoeSplitsGateUpIntermediateAndDownHidden) {
  for (QuantKind q : {QuantKind::kBF16, QuantKind::kNVFP4}) {
    Plan p = planner(2).plan_moe(kE, 256, 7168, 2048, q);
    ASSERT_TRUE(p.enabled) << p.reason;
    EXPECT_EQ(p.op, q == QuantKind::kNVFP4 ? OpKind::kNvfp4Moe : OpKind::kBf16Moe);
    EXPECT_TRUE(p.layout.fused_gate_up);
    EXPECT_EQ(ranges(p.layout), (R{{0, 1024}, {1024, 2048}}));
    EXPECT_FALSE(p.down_layout.fused_gate_up);
    EXPECT_EQ(ranges(p.down_layout), (R{{0, 3584}, {3584, 7168}}));
  }
  Plan three = planner(3).plan_moe(kE, 256, 7168, 2048, QuantKind::kNVFP4);
  ASSERT_TRUE(three.enabled) << three.reason;
  EXPECT_EQ(ranges(three.layout), (R{{0, 768}, {768, 1408}, {1408, 2048}}));
  EXPECT_EQ(three.describe(),
            "partitioned 3 x [0,768) [768,1408) [1408,2048) (each with its gate and up rows); down 3 x [0,2432) "
            "[2432,4864) [4864,7168)");
}

TEST(Planner, MoeRules) {
  Planner pl = planner(2);
  EXPECT_EQ(pl.plan_moe(kE, 256, 7168, 2048, QuantKind::kFP8).reason,
            "quantization fp8 is not supported by locality-domain MoE (supported: bf16, nvfp4)");
  EXPECT_EQ(pl.plan_moe(kE, 256, 7172, 2048, QuantKind::kBF16).reason,
            "expert gate_up hidden K=7172 is not a multiple of 8 (bf16 rows need 16-byte alignment)");
  EXPECT_EQ(pl.plan_moe(kE, 256, 7168, 2056, QuantKind::kNVFP4).reason,
            "expert down intermediate K=2056 is not a multiple of 32 (NVFP4 packed-K alignment: 16-byte rows)");
  EXPECT_EQ(pl.plan_moe(kE, 256, 7168, 2056, QuantKind::kBF16).reason,
            "expert gate_up intermediate: N=2056 is not a multiple of the 16-row alignment (the split would need padding)");
  EXPECT_EQ(pl.plan_moe(kE, 256, 7176, 2048, QuantKind::kBF16).reason,
            "expert down hidden: N=7176 is not a multiple of the 16-row alignment (the split would need padding)");
  LocalityDomainPolicy pol = on();
  pol.allowed_ops = {OpKind::kNvfp4Moe};
  EXPECT_EQ(Planner(pol, domains(2)).plan_moe(kE, 256, 7168, 2048, QuantKind::kBF16).reason,
            "op bf16_moe is not in the policy's allowed_ops {nvfp4_moe}");
  pol = on();
  pol.exclude_modules = {"*.experts"};
  EXPECT_EQ(Planner(pol, domains(2)).plan_moe(kE, 256, 7168, 2048, QuantKind::kBF16).reason,
            "module 'model.layers.3.mlp.experts' is excluded by policy pattern '*.experts'");
}

// ---- policy and names ----------------------------------------------------------------------

TEST(Policy, NamesRoundTripAndUnknownNamesThrow) {
  for (OpKind k : kAllOpKinds) EXPECT_EQ(op_kind_from_name(op_kind_name(k)), k);
  try {
    op_kind_from_name("fp8_linear");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp8_linear'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(quant_kind_from_name("nvfp4"), QuantKind::kNVFP4);
  EXPECT_THROW(quant_kind_from_name("int4"), Error);
  EXPECT_STREQ(weight_mode_name(WeightMode::kFusedGateUp), "FUSED_GATE_UP");
}

TEST(Policy, ValidateNamesBadNumPartitions) {
  LocalityDomainPolicy pol = on();
  pol.num_partitions = -1;
  try {
    Planner(pol, domains(2));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_partitions"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos) << e.what();
  }
  pol.num_partitions = 1000;
  EXPECT_THROW(pol.validate(), Error);
}

TEST(Policy, ExcludingPatternIsFullMatch) {
  LocalityDomainPolicy pol;
  EXPECT_EQ(pol.excluding_pattern("model.layers.9.mlp.gate"), "*.mlp.gate");
  EXPECT_EQ(pol.excluding_pattern("model.layers.9.mlp.gate_up_proj"), "");
  EXPECT_EQ(pol.excluding_pattern("lm_head"), "lm_head");
  EXPECT_EQ(pol.excluding_pattern("model.lm_head_extra"), "");
}

}  // namespace
}  // namespace locus::locality
