// The MLA module on CUDA, locality domains off and on (2 emulated domains: green-context
// partitions), against the CPU module on the same weights and the fp64 reference of the block:
// a prompt through the prefill path, then absorbed decode steps appending to the latent cache,
// then one batched decode step over two sequences. Outputs are poisoned first.
#include <gtest/gtest.h>

#include "cuda_locality_util.h"
#include "cuda_test_util.h"
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

// Parameter: the number of emulated locality domains for the LD-on runs.
class CudaMla : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    LOCUS_REQUIRE_GPU();
    ld_ = CudaLocality::emulated(GetParam());
  }
  modules::ModuleContext ctx(bool ld, Device d) const { return ld_.ctx("model.layers.0.self_attn", ld, d); }
  CudaLocality ld_;
};

// One module under test with its caches for two sequences.
struct Subject {
  std::unique_ptr<MLA> mla;
  MlaKvCache a, b;
  Device device;
};

TEST_P(CudaMla, PrefillThenAbsorbedDecodeMatchCpuAndFp64LdOffAndOn) {
  const Device dev = Device::cuda(0), cpu = Device::cpu();
  for (const MlaConfig& c : {small_cfg(32), wide_cfg()}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " heads " << c.num_heads << " kv_lora " << c.kv_lora_rank);
    // Weight scale 0.2 for the small config; 0.05 for the wide one, so that its 128-dim scores
    // stay O(1) as in a trained model (with 0.2 they are about ten times larger and the softmax
    // amplifies the bf16 roundings of q and k past kMlaTolerance, already on the CPU module).
    const MlaWeights w(c, seed, c.kv_lora_rank > 64 ? 0.05 : 0.2);
    const int64_t prompt = 9, steps = 6, prompt_b = 5, cap = prompt + steps + 2;
    const Tensor x = randn({prompt + steps + 1, c.hidden_size}, DType::kBF16, seed + 100);
    const Tensor xb = randn({prompt_b + 1, c.hidden_size}, DType::kBF16, seed + 200);

    std::vector<Subject> subjects;
    for (auto [ld, d] : {std::pair{false, cpu}, std::pair{false, dev}, std::pair{true, dev}})
      subjects.push_back({build(ctx(ld, d), c, w), new_cache(c, cap, d), new_cache(c, cap, d), d});
    Subject& on = subjects[2];
    ASSERT_TRUE(on.mla->kv_b_proj().partitioned()) << on.mla->kv_b_proj().plan().describe();
    ASSERT_TRUE(on.mla->k_b_plan().enabled) << on.mla->k_b_plan().describe();
    ASSERT_TRUE(on.mla->v_b_plan().enabled) << on.mla->v_b_plan().describe();

    // Every output row of a subject, in order: sequence a's prompt (prefill path), its `steps`
    // single-token steps (absorbed), then one absorbed step over a and b together (b's prompt
    // went through the prefill path before).
    const int64_t rows = prompt + steps + 2;
    std::vector<Tensor> outs;
    for (Subject& s : subjects) {
      Tensor all = Tensor::empty({rows, c.hidden_size}, DType::kBF16);
      auto keep = [&](const Tensor& y, int64_t row0) {
        all.slice(0, row0, row0 + y.size(0)).copy_(y.device().is_cpu() ? y : fetch(y));
      };
      keep(run(*s.mla, s.a, x.slice(0, 0, prompt).to(s.device), MlaPath::kPrefill), 0);
      for (int64_t k = 0; k < steps; ++k)
        keep(run(*s.mla, s.a, x.slice(0, prompt + k, prompt + k + 1).to(s.device), MlaPath::kAbsorbed), prompt + k);
      run(*s.mla, s.b, xb.slice(0, 0, prompt_b).to(s.device), MlaPath::kPrefill);
      Tensor x2 = Tensor::empty({2, c.hidden_size}, DType::kBF16), pos = Tensor::empty({2}, DType::kI32);
      x2.slice(0, 0, 1).copy_(x.slice(0, prompt + steps, prompt + steps + 1));
      x2.slice(0, 1, 2).copy_(xb.slice(0, prompt_b, prompt_b + 1));
      pos.data<int32_t>()[0] = static_cast<int32_t>(s.a.length);
      pos.data<int32_t>()[1] = static_cast<int32_t>(s.b.length);
      Tensor y = Tensor::empty({2, c.hidden_size}, DType::kBF16, s.device);
      y.fill_nan_();
      s.mla->forward(x2.to(s.device), pos.to(s.device), {{&s.a, 1}, {&s.b, 1}}, y, MlaPath::kAbsorbed);
      keep(y, prompt + steps);
      outs.push_back(all);
    }
    EXPECT_EQ(subjects[1].a.length, prompt + steps + 1);

    // fp64: sequence a's rows, then b's last. One normwise error over all rows: a single row of
    // a small model is too few values for the tolerance's rms argument.
    std::vector<double> ref = ref_mla(*subjects[0].mla, w, x).v;
    const Mat ref_b = ref_mla(*subjects[0].mla, w, xb);
    const std::vector<double> ref_b_last = ref_b.rows_range(prompt_b, prompt_b + 1).v;
    ref.insert(ref.end(), ref_b_last.begin(), ref_b_last.end());
    for (size_t i = 0; i < subjects.size(); ++i) {
      SCOPED_TRACE(i == 0 ? "cpu" : i == 1 ? "cuda, locality off" : "cuda, locality on");
      EXPECT_LT(rel_error(outs[i], ref), kMlaTolerance);
      EXPECT_LT(rel_error(outs[i].slice(0, 0, prompt), to_doubles(outs[0].slice(0, 0, prompt))), kCpuCudaTolerance)
          << "prefill vs the CPU module";
      EXPECT_LT(rel_error(outs[i].slice(0, prompt, rows), to_doubles(outs[0].slice(0, prompt, rows))),
                kCpuCudaTolerance)
          << "decode steps vs the CPU module";
    }
  }
}


INSTANTIATE_TEST_SUITE_P(Domains, CudaMla, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Domains"; });

}  // namespace
}  // namespace locus::testing
