// GatedMLP: fp64 reference, locality on vs off bit for bit, the unfused SwiGLU fallback, policy
// exclusion of shared experts and reload validation across both projections.
#include "modules/gated_mlp.h"

#include <gtest/gtest.h>

#include "module_test_util.h"

namespace locus::testing {
namespace {

using modules::GatedMLP;
using modules::GatedMlpConfig;

struct MlpWeights {
  Tensor gate, up, down;
  MlpWeights(int64_t H, int64_t I, uint64_t seed)
      : gate(randn({I, H}, DType::kBF16, seed)), up(randn({I, H}, DType::kBF16, seed + 1)),
        down(randn({H, I}, DType::kBF16, seed + 2)) {}
  modules::WeightMap map() const { return {{"gate_proj.weight", gate}, {"up_proj.weight", up}, {"down_proj.weight", down}}; }
};

std::unique_ptr<GatedMLP> build(const modules::ModuleContext& ctx, int64_t H, int64_t I, const MlpWeights& w,
                                 bool fuse = true) {
  GatedMlpConfig c;
  c.hidden_size = H;
  c.intermediate_size = I;
  c.fuse_swiglu = fuse;
  auto mlp = std::make_unique<GatedMLP>(ctx, c);
  for (const auto& [k, v] : w.map()) mlp->load(k, v);
  mlp->transform();
  mlp->localize();
  return mlp;
}

Tensor run(const GatedMLP& m, const Tensor& x) {
  Tensor y = Tensor::empty({x.size(0), m.config().hidden_size}, DType::kBF16);
  y.fill_nan_();
  m.forward(x, y);
  return y;
}

// The intermediate activation is stored in bf16 by design, so the reference rounds it too.
Mat ref_mlp(const Tensor& x, const MlpWeights& w) {
  return ref_linear(round_bf16(ref_swiglu(Mat(x), Mat(w.gate), Mat(w.up))), Mat(w.down));
}

TEST(GatedMlpTest, MatchesFp64ReferenceAndLocalityIsBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 5, H = 64, I = 128;
  Tensor x = randn({M, H}, DType::kBF16, seed);
  MlpWeights w(H, I, seed + 10);
  const Mat ref = ref_mlp(x, w);
  auto off = build(make_ld(0).ctx("model.layers.0.mlp"), H, I, w);
  const Tensor y_off = run(*off, x);
  EXPECT_LT(rel_error(y_off, ref.v), bf16_gemm_tolerance(I));
  for (int domains : {1, 2, 4}) {
    SCOPED_TRACE(domains);
    auto on = build(make_ld(domains).ctx("model.layers.0.mlp"), H, I, w);
    EXPECT_EQ(on->gate_up_proj().partitioned(), domains > 1) << on->gate_up_proj().plan().describe();
    EXPECT_EQ(on->down_proj().partitioned(), domains > 1) << on->down_proj().plan().describe();
    EXPECT_TRUE(on->uses_fused_swiglu());
    EXPECT_TRUE(bitwise_equal(run(*on, x), y_off));
    // Unfused fallback (gemm into fp32, then ops::swiglu): the same bits.
    auto unfused = build(make_ld(domains).ctx("model.layers.0.mlp"), H, I, w, /*fuse=*/false);
    EXPECT_FALSE(unfused->uses_fused_swiglu());
    EXPECT_TRUE(bitwise_equal(run(*unfused, x), y_off));
  }
}

TEST(GatedMlpTest, SharedExpertsStayWholeThroughThePolicy) {
  const uint64_t seed = fresh_seed();
  const int64_t H = 64, I = 64;
  MlpWeights w(H, I, seed);
  auto mlp = build(make_ld(2).ctx("model.layers.3.mlp.shared_experts"), H, I, w);
  EXPECT_FALSE(mlp->gate_up_proj().partitioned());
  EXPECT_FALSE(mlp->down_proj().partitioned());
  EXPECT_NE(mlp->gate_up_proj().plan().reason.find("*shared_experts*"), std::string::npos)
      << mlp->gate_up_proj().plan().reason;
  EXPECT_EQ(mlp->memory().domain_bytes(0), 0);
  std::vector<modules::PlanRecord> plans;
  mlp->collect_plans(&plans);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].module, "model.layers.3.mlp.shared_experts.gate_up_proj");
  EXPECT_EQ(plans[1].module, "model.layers.3.mlp.shared_experts.down_proj");
}

TEST(GatedMlpTest, ReloadValidatesBothProjectionsBeforeWriting) {
  const uint64_t seed = fresh_seed();
  const int64_t M = 3, H = 64, I = 64;
  Tensor x = randn({M, H}, DType::kBF16, seed);
  MlpWeights w(H, I, seed + 1), w2(H, I, seed + 2);
  auto mlp = build(make_ld(2).ctx("mlp"), H, I, w);
  EXPECT_EQ(mlp->state(), modules::LifecycleState::kLocalized);
  const Tensor y = run(*mlp, x);
  const auto p1 = mlp->gate_up_proj().weight_data_ptrs(), p2 = mlp->down_proj().weight_data_ptrs();
  modules::WeightMap bad = w2.map();
  bad["down_proj.weight"] = randn({H, I + 8}, DType::kBF16, seed);
  EXPECT_THROW(mlp->reload(bad), Error);
  EXPECT_TRUE(bitwise_equal(run(*mlp, x), y));  // gate/up were not written either
  mlp->reload(w2.map());
  EXPECT_EQ(mlp->gate_up_proj().weight_data_ptrs(), p1);
  EXPECT_EQ(mlp->down_proj().weight_data_ptrs(), p2);
  EXPECT_LT(rel_error(run(*mlp, x), ref_mlp(x, w2).v), bf16_gemm_tolerance(I));
  EXPECT_THROW(mlp->load("gate.weight", w.gate), Error);  // not a checkpoint name
}

TEST(GatedMlpTest, MissingPiecesUseCheckpointNames) {
  GatedMlpConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 32;
  GatedMLP mlp(make_ld(0).ctx("mlp"), c);
  mlp.load("up_proj.weight", randn({32, 32}, DType::kBF16, 1));
  EXPECT_EQ(mlp.missing_pieces(), (std::vector<std::string>{"gate_proj.weight", "down_proj.weight"}));
  EXPECT_THROW(mlp.transform(), Error);
}

}  // namespace
}  // namespace locus::testing

namespace locus::testing {
namespace {

// NVFP4 dense MLP (as ModelOpt exports layers 0-2): reference on the dequantized weights, LD on vs off.
TEST(GatedMlpTest, Nvfp4MatchesReferenceAndLocalityIsBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 3, H = 256, I = 256;
  MlpWeights w(H, I, seed);
  // gate and up with different global scales (random bf16 weights can share an amax by chance).
  const ops::Nvfp4Weight qg = ops::nvfp4_quantize(w.gate), qd = ops::nvfp4_quantize(w.down);
  const ops::Nvfp4Weight qu = ops::nvfp4_quantize(w.up, qg.global_scale * 1.5f);
  MlpWeights deq = w;
  deq.gate = ops::nvfp4_dequantize(qg);
  deq.up = ops::nvfp4_dequantize(qu);
  deq.down = ops::nvfp4_dequantize(qd);
  Tensor x = randn({M, H}, DType::kBF16, seed + 1);
  Tensor y_off;
  for (int domains : {0, 2}) {
    SCOPED_TRACE(domains);
    GatedMlpConfig c;
    c.hidden_size = H;
    c.intermediate_size = I;
    c.quant = locality::QuantKind::kNVFP4;
    GatedMLP mlp(make_ld(domains).ctx("model.layers.0.mlp"), c);
    load_nvfp4(mlp, "gate_proj.", qg);
    load_nvfp4(mlp, "up_proj.", qu);
    load_nvfp4(mlp, "down_proj.", qd);
    mlp.localize();
    EXPECT_EQ(mlp.down_proj().partitioned(), domains == 2);
    EXPECT_FALSE(mlp.uses_fused_swiglu());  // gate and up carry different global scales
    const Tensor y = run(mlp, x);
    EXPECT_LT(rel_error(y, ref_mlp(x, deq).v), bf16_gemm_tolerance(I));
    if (domains == 0) y_off = y;
    else EXPECT_TRUE(bitwise_equal(y, y_off));
  }
}

}  // namespace
}  // namespace locus::testing

namespace locus::testing {
namespace {

TEST(GatedMlpTest, UnfusedRowSplitWhenTheFusedSplitIsRefused) {
  const uint64_t seed = fresh_seed();
  const int64_t M = 4, H = 32, I = 24;
  Tensor x = randn({M, H}, DType::kBF16, seed);
  MlpWeights w(H, I, seed + 1);
  auto off = build(make_ld(0).ctx("mlp"), H, I, w);
  auto on = build(make_ld(2).ctx("mlp"), H, I, w);
  EXPECT_TRUE(on->gate_up_proj().unfused_split());
  EXPECT_TRUE(on->gate_up_proj().partitioned());
  EXPECT_FALSE(on->uses_fused_swiglu());
  EXPECT_TRUE(bitwise_equal(run(*on, x), run(*off, x)));
}

}  // namespace
}  // namespace locus::testing
