// The MLA module on CUDA, locality domains off and on (2 emulated domains: green-context
// partitions), against the CPU module on the same weights and the fp64 reference of the block:
// a prompt through the prefill path, then absorbed decode steps appending to the latent cache,
// then one batched decode step over two sequences. Outputs are poisoned first (run() does it).
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "locality/domain_place.h"
#include "locality/planner.h"
#include "locality/topology.h"
#include "modules/mla_test_util.h"

namespace locus::testing {
namespace {

// Each module's output is within kMlaTolerance of the fp64 reference (mla_test_util.h: about
// ten bf16 storage points), so the CUDA and CPU modules are within twice that of each other.
constexpr double kCpuCudaTolerance = 2 * kMlaTolerance;

// DeepSeek-V3's per-head dims (latent 512, nope 128, rope 64, v 128) with 16 heads.
MlaConfig wide_cfg() {
  MlaConfig c = small_cfg(96);
  c.hidden_size = 256;
  c.num_heads = 16;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  return c;
}

class CudaMla : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCUS_REQUIRE_GPU();
    topo_ = locality::resolve_topology(Device::cuda(0), 2);
    locality::LocalityDomainPolicy pol;
    pol.enabled = true;
    planner_ = std::make_shared<locality::Planner>(pol, topo_);
    runtime_ = locality::shared_locality_runtime(topo_);
  }
  modules::ModuleContext ctx(bool ld, Device d) const {
    modules::ModuleContext c;
    c.device = d;
    c.name = "model.layers.0.self_attn";
    if (ld) {
      c.planner = planner_;
      c.runtime = runtime_;
    }
    return c;
  }
  locality::Topology topo_;
  std::shared_ptr<locality::Planner> planner_;
  std::shared_ptr<const locality::LocalityRuntime> runtime_;
};

// One module under test with its caches for two sequences.
struct Subject {
  std::unique_ptr<MLA> mla;
  MlaKvCache a, b;
  Device device;
};

TEST_F(CudaMla, PrefillThenAbsorbedDecodeMatchCpuAndFp64LdOffAndOn) {
  const Device dev = Device::cuda(0), cpu = Device::cpu();
  for (const MlaConfig& c : {small_cfg(32), wide_cfg()}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " heads " << c.num_heads << " kv_lora " << c.kv_lora_rank);
    const MlaWeights w(c, seed);
    const int64_t prompt = 9, steps = 3, prompt_b = 5, cap = prompt + steps + 2;
    const Tensor x = randn({prompt + steps + 1, c.hidden_size}, DType::kBF16, seed + 100);
    const Tensor xb = randn({prompt_b + 1, c.hidden_size}, DType::kBF16, seed + 200);

    std::vector<Subject> subjects;
    for (auto [ld, d] : {std::pair{false, cpu}, std::pair{false, dev}, std::pair{true, dev}})
      subjects.push_back({build(ctx(ld, d), c, w), new_cache(c, cap, d), new_cache(c, cap, d), d});
    Subject& on = subjects[2];
    ASSERT_TRUE(on.mla->kv_b_proj().partitioned()) << on.mla->kv_b_proj().plan().describe();
    ASSERT_TRUE(on.mla->k_b_plan().enabled) << on.mla->k_b_plan().describe();
    ASSERT_TRUE(on.mla->v_b_plan().enabled) << on.mla->v_b_plan().describe();

    const Mat ref = ref_mla(*subjects[0].mla, w, x), ref_b = ref_mla(*subjects[0].mla, w, xb);
    auto host = [](const Tensor& y) { return y.device().is_cpu() ? y : fetch(y); };
    // Sequence a: the prompt, then one token per step (absorbed); sequence b: its prompt.
    std::vector<std::vector<Tensor>> outs(subjects.size());
    for (size_t i = 0; i < subjects.size(); ++i) {
      Subject& s = subjects[i];
      outs[i].push_back(host(run(*s.mla, s.a, x.slice(0, 0, prompt).to(s.device), MlaPath::kPrefill)));
      for (int64_t k = 0; k < steps; ++k)
        outs[i].push_back(host(run(*s.mla, s.a, x.slice(0, prompt + k, prompt + k + 1).to(s.device), MlaPath::kAbsorbed)));
      run(*s.mla, s.b, xb.slice(0, 0, prompt_b).to(s.device), MlaPath::kPrefill);
    }
    for (size_t i = 0; i < subjects.size(); ++i) {
      SCOPED_TRACE(i == 0 ? "cpu" : i == 1 ? "cuda, locality off" : "cuda, locality on");
      EXPECT_LT(rel_error(outs[i][0], ref.rows_range(0, prompt).v), kMlaTolerance) << "prefill";
      for (int64_t k = 0; k < steps; ++k)
        EXPECT_LT(rel_error(outs[i][1 + k], ref.rows_range(prompt + k, prompt + k + 1).v), kMlaTolerance) << "step " << k;
      for (size_t j = 0; j < outs[i].size(); ++j)
        EXPECT_LT(rel_error(outs[i][j], to_doubles(outs[0][j])), kCpuCudaTolerance) << "vs the CPU module, output " << j;
    }

    // One absorbed step over both sequences in one call: a's last token and b's last token.
    Tensor x2 = Tensor::empty({2, c.hidden_size}, DType::kBF16);
    x2.slice(0, 0, 1).copy_(x.slice(0, prompt + steps, prompt + steps + 1));
    x2.slice(0, 1, 2).copy_(xb.slice(0, prompt_b, prompt_b + 1));
    std::vector<Tensor> batched;
    for (Subject& s : subjects) {
      Tensor pos = Tensor::empty({2}, DType::kI32);
      pos.data<int32_t>()[0] = static_cast<int32_t>(s.a.length);
      pos.data<int32_t>()[1] = static_cast<int32_t>(s.b.length);
      Tensor y = Tensor::empty({2, c.hidden_size}, DType::kBF16, s.device);
      y.fill_nan_();
      s.mla->forward(x2.to(s.device), pos.to(s.device), {{&s.a, 1}, {&s.b, 1}}, y, MlaPath::kAbsorbed);
      batched.push_back(host(y));
    }
    for (size_t i = 0; i < subjects.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_LT(rel_error(batched[i].slice(0, 0, 1), ref.rows_range(prompt + steps, prompt + steps + 1).v), kMlaTolerance);
      EXPECT_LT(rel_error(batched[i].slice(0, 1, 2), ref_b.rows_range(prompt_b, prompt_b + 1).v), kMlaTolerance);
      EXPECT_LT(rel_error(batched[i], to_doubles(batched[0])), kCpuCudaTolerance);
    }
  }
}

}  // namespace
}  // namespace locus::testing
