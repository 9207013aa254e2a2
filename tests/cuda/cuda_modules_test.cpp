// Modules on the CUDA backend: Linear (BF16, NVFP4, NVFP4 fused gate/up with per-half scales) and
// GatedMLP, each with locality domains off and on (2 emulated domains: green-context partitions),
// against the CPU module on the same weights and, for the BF16 Linear, an fp64 reference.
// Outputs are poisoned first; localize must release the full weight and reload keep the pointers.
#include <gtest/gtest.h>

#include "core/device_hooks.h"
#include "cuda_locality_util.h"
#include "cuda_test_util.h"
#include "modules/gated_mlp.h"
#include "modules/linear.h"

namespace locus::testing {
namespace {

using modules::GatedMLP;
using modules::GatedMlpConfig;
using modules::Linear;
using modules::LinearConfig;
using modules::ModuleContext;

class CudaModules : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCUS_REQUIRE_GPU();
    ld_ = CudaLocality::emulated(2);
  }
  ModuleContext ctx(const std::string& name, bool ld, Device d) const { return ld_.ctx(name, ld, d); }
  static Tensor run(const Linear& l, const Tensor& x, int64_t n) {
    Tensor y = Tensor::empty({x.size(0), n}, DType::kBF16, x.device());
    y.fill_nan_();
    l.forward(x, y);
    return y.device().is_cpu() ? y : fetch(y);
  }
  static Tensor run(const GatedMLP& m, const Tensor& x, int64_t h) {
    Tensor y = Tensor::empty({x.size(0), h}, DType::kBF16, x.device());
    y.fill_nan_();
    m.forward(x, y);
    return y.device().is_cpu() ? y : fetch(y);
  }
  static Tensor scalar(float v) {
    Tensor s = Tensor::empty({}, DType::kFP32);
    s.data<float>()[0] = v;
    return s;
  }
  CudaLocality ld_;
};

TEST_F(CudaModules, Bf16LinearLdOnOffCpuAndFp64AgreeAndReloadKeepsPointers) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 8, K = 1024, N = 2048;
  const Device dev = Device::cuda(0);
  Tensor x = randn({M, K}, DType::kBF16, seed), w = randn({N, K}, DType::kBF16, seed + 1, 0.05);
  Tensor b = randn({N}, DType::kBF16, seed + 2), w2 = randn({N, K}, DType::kBF16, seed + 3, 0.05);
  LinearConfig lc;
  lc.in_features = K;
  lc.out_features = N;
  lc.bias = true;
  Linear cpu(ctx("proj", false, Device::cpu()), lc), off(ctx("proj", false, dev), lc), on(ctx("proj", true, dev), lc);
  for (Linear* l : {&cpu, &off, &on}) {
    l->load("weight", w);
    l->load("bias", b);
    l->transform();
  }
  const int64_t untagged_before = memory_stats(dev, -1).live_bytes;
  on.localize();
  ASSERT_TRUE(on.plan().enabled) << on.plan().reason;
  EXPECT_GE(untagged_before - memory_stats(dev, -1).live_bytes, N * K * 2);  // the full weight went back
  EXPECT_GE(memory_stats(dev, 0).live_bytes, N / 2 * K * 2);
  EXPECT_GE(memory_stats(dev, 1).live_bytes, N / 2 * K * 2);
  cpu.localize();  // LD off: nothing to split, the weights stay whole
  off.localize();
  const Tensor xd = x.to(dev);
  const double tol = bf16_gemm_tolerance(K);
  const Tensor yc = run(cpu, x, N);
  EXPECT_LT(rel_error(yc, ref_gemm(x, w, b)), tol);
  EXPECT_LT(rel_error(run(off, xd, N), to_doubles(yc)), tol);
  EXPECT_LT(rel_error(run(on, xd, N), to_doubles(yc)), tol);

  const auto ptrs = on.weight_data_ptrs();
  on.reload({{"weight", w2}, {"bias", b}});
  EXPECT_EQ(ptrs, on.weight_data_ptrs());
  EXPECT_LT(rel_error(run(on, xd, N), ref_gemm(x, w2, b)), tol);
}

TEST_F(CudaModules, GatedMlpLdOnMatchesOffAndCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 8, H = 1024, I = 2048;
  const Device dev = Device::cuda(0);
  GatedMlpConfig gc;
  gc.hidden_size = H;
  gc.intermediate_size = I;
  GatedMLP mc(ctx("mlp", false, Device::cpu()), gc), mo(ctx("mlp", false, dev), gc), ml(ctx("mlp", true, dev), gc);
  Tensor g = randn({I, H}, DType::kBF16, seed, 0.05), u = randn({I, H}, DType::kBF16, seed + 1, 0.05);
  Tensor dn = randn({H, I}, DType::kBF16, seed + 2, 0.05), x = randn({M, H}, DType::kBF16, seed + 3);
  for (GatedMLP* m : {&mc, &mo, &ml}) {
    m->load("gate_proj.weight", g);
    m->load("up_proj.weight", u);
    m->load("down_proj.weight", dn);
    m->localize();
  }
  EXPECT_TRUE(ml.gate_up_proj().plan().enabled) << ml.gate_up_proj().plan().reason;
  EXPECT_TRUE(ml.down_proj().plan().enabled) << ml.down_proj().plan().reason;
  const Tensor xd = x.to(dev);
  // Two chained bf16 products (the intermediate is rounded to bf16 between them).
  const double tol = bf16_gemm_tolerance(H) + bf16_gemm_tolerance(I);
  const Tensor yc = run(mc, x, H), yo = run(mo, xd, H);
  EXPECT_LT(rel_error(yo, to_doubles(yc)), tol);
  EXPECT_LT(rel_error(run(ml, xd, H), to_doubles(yo)), tol);
}

TEST_F(CudaModules, Nvfp4LinearsLdOnMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 8, K = 1024, N = 2048, I = 1024;
  const Device dev = Device::cuda(0);
  const Tensor x = randn({M, K}, DType::kBF16, seed), xd = x.to(dev);
  // The CPU NVFP4 Linear computes the same dequantized product in fp32: only the two
  // implementations' accumulation orders and the bf16 output rounding differ.
  const double tol = bf16_gemm_tolerance(K);

  ops::Nvfp4Weight q = ops::nvfp4_quantize(randn({N, K}, DType::kFP32, seed + 1));
  LinearConfig nc;
  nc.in_features = K;
  nc.out_features = N;
  nc.quant = locality::QuantKind::kNVFP4;
  Linear nvc(ctx("nv", false, Device::cpu()), nc), nvo(ctx("nv", false, dev), nc), nvl(ctx("nv", true, dev), nc);
  for (Linear* l : {&nvc, &nvo, &nvl}) {
    l->load("weight", q.packed);
    l->load("weight_scale", q.scales);
    l->load("weight_scale_2", scalar(q.global_scale));
    l->localize();
  }
  EXPECT_TRUE(nvl.plan().enabled) << nvl.plan().reason;
  const Tensor yc = run(nvc, x, N);
  EXPECT_LT(rel_error(run(nvo, xd, N), to_doubles(yc)), tol);
  EXPECT_LT(rel_error(run(nvl, xd, N), to_doubles(yc)), tol);

  // Fused gate/up whose halves carry different global scales (kept per half).
  ops::Nvfp4Weight qg = ops::nvfp4_quantize(randn({I, K}, DType::kFP32, seed + 2));
  ops::Nvfp4Weight qu = ops::nvfp4_quantize(randn({I, K}, DType::kFP32, seed + 3));
  LinearConfig fc = nc;
  fc.out_features = I;
  fc.mode = locality::WeightMode::kFusedGateUp;
  Linear fcpu(ctx("gu", false, Device::cpu()), fc), fgpu(ctx("gu", true, dev), fc);
  for (Linear* l : {&fcpu, &fgpu}) {
    for (const auto& [piece, qq, scale] : {std::tuple{"gate.", &qg, qg.global_scale},
                                           std::tuple{"up.", &qu, 2.f * qu.global_scale}}) {
      l->load(std::string(piece) + "weight", qq->packed);
      l->load(std::string(piece) + "weight_scale", qq->scales);
      l->load(std::string(piece) + "weight_scale_2", scalar(scale));
    }
    l->localize();
  }
  EXPECT_TRUE(fgpu.per_half_scales());
  EXPECT_LT(rel_error(run(fgpu, xd, I), to_doubles(run(fcpu, x, I))), 2 * tol);  // silu(g) * u: two products
}

}  // namespace
}  // namespace locus::testing
