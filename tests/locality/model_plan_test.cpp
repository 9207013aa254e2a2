// Whole-model plan (what `locus plan` prints), and the `locus plan` command itself.
#include "locality/model_plan.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sys/wait.h>

#include "core/error.h"
#include "test_util.h"

namespace locus::locality {
namespace {

QuantKind bf16_except_nothing(const std::string&) { return QuantKind::kBF16; }

std::map<std::string, LayerPlan> by_type(const std::vector<LayerPlan>& v) {
  std::map<std::string, LayerPlan> m;
  for (const auto& e : v) m[e.layer_type] = e;
  return m;
}

TEST(ModelPlan, DeepSeekV3TwoDomainsBf16) {
  LocalityDomainPolicy pol;
  pol.enabled = true;
  Planner planner(pol, cpu_topology(2, 2, "test"));
  auto m = by_type(plan_deepseek_model(DeepseekShapes{}, planner, bf16_except_nothing));
  for (const char* t : {"q_a_proj", "q_b_proj", "kv_a_proj", "kv_b absorbed k", "kv_b absorbed v", "o_proj",
                        "dense gate_up", "dense down", "router gate", "experts", "shared gate_up", "shared down",
                        "lm_head"}) {
    ASSERT_TRUE(m.count(t)) << t;
  }
  EXPECT_TRUE(m["q_a_proj"].plan.enabled);
  EXPECT_EQ(m["q_a_proj"].count, 61);
  EXPECT_EQ(m["q_a_proj"].shape, "[1536, 7168]");
  EXPECT_EQ(m["q_a_proj"].domain_bytes, (std::vector<int64_t>{768LL * 7168 * 2, 768LL * 7168 * 2}));
  // 576 = 2 x 288 would split, but MLA keeps kv_a whole, and the plan says so.
  EXPECT_FALSE(m["kv_a_proj"].plan.enabled);
  EXPECT_EQ(m["kv_a_proj"].plan.reason, kKvAProjUnpartitionedReason);
  EXPECT_TRUE(m["kv_a_proj"].domain_bytes.empty());
  EXPECT_EQ(m["kv_b absorbed k"].shape, "128 x [128, 512]");
  EXPECT_EQ(m["kv_b absorbed k"].plan.describe(), "partitioned 2 x [0,64) [64,128)");
  EXPECT_EQ(m["dense gate_up"].shape, "[36864, 7168]");
  EXPECT_EQ(m["dense gate_up"].count, 3);
  EXPECT_EQ(m["experts"].count, 58);
  EXPECT_EQ(m["experts"].domain_bytes[0] + m["experts"].domain_bytes[1], m["experts"].whole_bytes);
  EXPECT_EQ(m["router gate"].plan.reason, "module 'model.layers.3.mlp.gate' is excluded by policy pattern '*.mlp.gate'");
  EXPECT_FALSE(m["shared gate_up"].plan.enabled);
  EXPECT_EQ(m["lm_head"].plan.reason, "module 'lm_head' is excluded by policy pattern 'lm_head'");
  EXPECT_TRUE(m["lm_head"].domain_bytes.empty());
  const std::string text = format_model_plan(plan_deepseek_model(DeepseekShapes{}, planner, bf16_except_nothing), planner);
  EXPECT_NE(text.find("weight bytes per domain: d0 10.50 MiB, d1 10.50 MiB (of 21.00 MiB)"), std::string::npos) << text;
}

TEST(ModelPlan, Nvfp4KvAIsRefusedWithItsReason) {
  LocalityDomainPolicy pol;
  pol.enabled = true;
  Planner planner(pol, cpu_topology(2, 2, "test"));
  auto m = by_type(plan_deepseek_model(DeepseekShapes{}, planner, [](const std::string&) { return QuantKind::kNVFP4; }));
  EXPECT_EQ(m["kv_a_proj"].plan.reason,
            "out_features: N=576 is not a multiple of the 128-row alignment (the split would need padding)");
  EXPECT_TRUE(m["experts"].plan.enabled) << m["experts"].plan.reason;
  EXPECT_EQ(m["o_proj"].whole_bytes, 7168LL * (16384 / 2 + 16384 / 16));
}

TEST(ModelPlan, DefaultPolicyLeavesEverythingWhole) {
  Planner planner(LocalityDomainPolicy{}, cpu_topology(2, 2, "test"));
  for (const LayerPlan& e : plan_deepseek_model(DeepseekShapes{}, planner, bf16_except_nothing)) {
    EXPECT_FALSE(e.plan.enabled) << e.layer_type;
    EXPECT_EQ(e.plan.reason, "locality domains are disabled by the policy (enable with --enable-locality-domains)");
  }
}

TEST(ModelPlan, BadShapesAreNamed) {
  Planner planner(LocalityDomainPolicy{}, cpu_topology(2, 2, "test"));
  DeepseekShapes s;
  s.heads = 0;
  try {
    plan_deepseek_model(s, planner, bf16_except_nothing);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "model shape heads must be positive, got 0");
  }
  s = DeepseekShapes{};
  s.dense_layers = 62;
  EXPECT_THROW(plan_deepseek_model(s, planner, bf16_except_nothing), Error);
}

// DeepSeek-V3 in BF16: a decode step reads every weight but the routed experts no token picked.
// The sum is written out by layer here, apart from the plan's entries.
TEST(ModelPlan, DecodeStepReadsTheWeightsOfThePickedExperts) {
  Planner planner(LocalityDomainPolicy{}, cpu_topology(2, 2, "test"));
  const DeepseekShapes s;
  const auto plans = plan_deepseek_model(s, planner, bf16_except_nothing);
  const double attention = 1536.0 * 7168 + 24576.0 * 1536 + 576.0 * 7168 + 2 * 128.0 * 128 * 512 + 7168.0 * 16384;
  const double dense_mlp = 3.0 * 18432 * 7168;
  const double expert = 3.0 * 2048 * 7168;
  const double fixed = 61 * attention + 3 * dense_mlp + 58 * (256.0 * 7168 + expert) + 129280.0 * 7168;
  auto expected = [&](double experts_read) { return 2 * (fixed + 58 * experts_read * expert); };
  EXPECT_DOUBLE_EQ(decode_step_weight_bytes(plans, s, 1), expected(8));
  // 8 tokens: each expert is left out by all of them with probability (1 - 8/256)^8.
  EXPECT_NEAR(decode_step_weight_bytes(plans, s, 8), expected(256 * (1 - std::pow(31.0 / 32, 8))), 1.0);
  EXPECT_NEAR(decode_step_weight_bytes(plans, s, 100000), expected(256), 1.0);  // every expert
  const std::string text = format_decode_floor(plans, s, {1, 8}, 4000);
  char line[200];
  std::snprintf(line, sizeof line, "  batch 1: %.3f GiB per step; floor at 4000 GB/s: %.3f ms per step, %.1f tok/s\n",
                expected(8) / (1 << 30), expected(8) / 4e12 * 1e3, 4e12 / expected(8));
  EXPECT_NE(text.find(line), std::string::npos) << text << "\nwanted: " << line;
  EXPECT_NE(text.find("  batch 8: "), std::string::npos) << text;
  EXPECT_EQ(format_decode_floor(plans, s, {1}, 0).find("floor"), std::string::npos);  // no bandwidth, no floor
  EXPECT_EQ(testing::error_text([&] { decode_step_weight_bytes(plans, s, 0); }), "decode batch must be positive, got 0");
  DeepseekShapes too_many;
  too_many.experts_per_token = 257;
  EXPECT_EQ(testing::error_text([&] { plan_deepseek_model(too_many, planner, bf16_except_nothing); }),
            "model shape experts_per_token must be in [1, experts=256], got 257");
}

// ---- `locus plan` --------------------------------------------------------------------------

struct Result {
  int rc;
  std::string out;
};

Result run_locus(const std::string& args) {
  // The fake-domain variable would override --domains; run the command without it.
  const std::string cmd = "env -u LOCUS_FAKE_LOCALITY_DOMAINS " + testing::locus_binary() + " plan " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(PlanCommand, PrintsEveryLayerTypeWithPlansAndBytes) {
  Result r = run_locus("--enable-locality-domains --domains 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("2 locality domains (config locality_domains.emulate, emulated)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("q_a_proj (model.layers.0.self_attn.q_a_proj, x61): bf16 [1536, 7168]\n"
                       "  partitioned 2 x [0,768) [768,1536)\n"
                       "  weight bytes per domain: d0 10.50 MiB, d1 10.50 MiB (of 21.00 MiB)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("not partitioned: module 'lm_head' is excluded by policy pattern 'lm_head'"), std::string::npos);
  EXPECT_NE(r.out.find("model totals"), std::string::npos);
}

TEST(PlanCommand, DefaultIsOffAndFlagsChangeShapes) {
  Result r = run_locus("--hidden 4096 --quant nvfp4 --layers 4 --dense-layers 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("policy: disabled"), std::string::npos) << r.out;
  // --quant nvfp4 splits the model as ModelOpt's exports do: attention stays BF16.
  EXPECT_NE(r.out.find("o_proj (model.layers.0.self_attn.o_proj, x4): bf16 [4096, 16384]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dense gate_up (model.layers.0.mlp.gate_up_proj, x1): nvfp4 [36864, 4096]"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("experts (model.layers.1.mlp.experts, x3)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("router gate (model.layers.1.mlp.gate, x3): bf16"), std::string::npos) << r.out;
  Result ops = run_locus("--enable-locality-domains --domains 3 --allowed-ops bf16_moe --no-excludes");
  ASSERT_EQ(ops.rc, 0) << ops.out;
  EXPECT_NE(ops.out.find("not partitioned: op bf16_linear is not in the policy's allowed_ops {bf16_moe}"), std::string::npos)
      << ops.out;
  EXPECT_NE(ops.out.find("experts (model.layers.3.mlp.experts, x58): bf16 256 x (gate_up [4096, 7168] + down [7168, 2048])\n"
                         "  partitioned 3 x [0,688) [688,1376) [1376,2048)"),
            std::string::npos)
      << ops.out;
}

TEST(PlanCommand, PrintsTheDecodeStepReadsAndFloor) {
  Result r = run_locus("--quant nvfp4 --decode-batch 1,32 --bandwidth-gbs 4000 --experts-per-token 4");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("decode step weight reads"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  batch 1: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  batch 32: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("floor at 4000 GB/s"), std::string::npos) << r.out;
  Result bad = run_locus("--decode-batch 0");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("--decode-batch"), std::string::npos) << bad.out;
}

TEST(PlanCommand, BadValuesFailWithAMessage) {
  Result q = run_locus("--quant int3");
  EXPECT_NE(q.rc, 0);
  EXPECT_NE(q.out.find("--quant"), std::string::npos) << q.out;
  Result h = run_locus("--hidden 0");
  EXPECT_EQ(h.rc, 1);
  EXPECT_NE(h.out.find("model shape hidden must be positive, got 0"), std::string::npos) << h.out;
  Result op = run_locus("--enable-locality-domains --domains 2 --allowed-ops bf16_linear,fp8_linear");
  EXPECT_EQ(op.rc, 1);
  EXPECT_NE(op.out.find("unknown locality-domain op 'fp8_linear'"), std::string::npos) << op.out;
  Result d = run_locus("--domains 0");
  EXPECT_NE(d.rc, 0);
  EXPECT_NE(d.out.find("--domains"), std::string::npos) << d.out;
}

TEST(PlanCommand, ReadsShapesFromAModelDirectory) {
  const std::string dir = ::testing::TempDir() + "/locus_plan_model";
  std::system(("mkdir -p " + dir).c_str());
  {
    std::ofstream f(dir + "/config.json");
    f << R"({"model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512,
             "moe_intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1, "n_group": 2,
             "topk_group": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 64,
             "q_lora_rank": 96, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
             "vocab_size": 1000})";
  }
  Result r = run_locus("--model " + dir + " --enable-locality-domains --domains 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("q_b_proj (model.layers.0.self_attn.q_b_proj, x3): bf16 [192, 96]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("experts (model.layers.1.mlp.experts, x2): bf16 8 x (gate_up [256, 256] + down [256, 128])"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("kv_b absorbed v (model.layers.0.self_attn.kv_b_proj.v_absorbed, x3): bf16 4 x [64, 32]"),
            std::string::npos)
      << r.out;
  Result missing = run_locus("--model " + dir + "/nope");
  EXPECT_NE(missing.rc, 0);
}

}  // namespace
}  // namespace locus::locality
