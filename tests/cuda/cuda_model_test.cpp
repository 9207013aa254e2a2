// The whole DeepSeek-V3 model on the CUDA backend (tiny checkpoint: one dense and one MoE layer,
// YaRN, q_lora), BF16 and NVFP4, locality domains off and on (2 emulated domains: green-context
// partitions). A batch of prompts is prefilled in one forward, then decoded token by token in
// batched steps; every logit row is checked against the fp64 reference forward the CPU tests use
// (same tolerance) and against the CPU backend, and LD on against LD off. Every allocation is
// poisoned (NaN) while the CUDA model loads and runs, so a row some kernel leaves unwritten fails.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "core/device_hooks.h"
#include "cuda_test_util.h"
#include "models/model_test_util.h"
#include "runtime/generator.h"

namespace locus::testing {
namespace {

const Device kDev = Device::cuda(0);

// Prompt lengths of the batch; each sequence then decodes kDecodeSteps more (known) tokens.
const std::vector<int64_t> kPromptLengths = {5, 2, 7};
constexpr int64_t kDecodeSteps = 3;

struct Sequence {
  std::vector<int32_t> ids;  // prompt, then the tokens fed by the decode steps
  std::vector<double> ref;   // fp64 reference logits of every position [ids.size(), V]
  int64_t prompt = 0;
};

// Sequences whose routing has no near-tie in the reference (ids_with_clear_routing), so BF16
// rounding on either backend cannot flip an expert choice.
std::vector<Sequence> make_sequences(const std::string& dir, const models::DeepseekV3Config& cfg, uint64_t seed) {
  auto ck = std::make_shared<runtime::Checkpoint>(runtime::Checkpoint::open(dir));
  const RefConfig rc = ref_config(cfg);
  const RefWeights weights = checkpoint_weights(ck);
  std::vector<Sequence> out;
  for (size_t i = 0; i < kPromptLengths.size(); ++i) {
    Sequence s;
    s.prompt = kPromptLengths[i];
    s.ids = ids_with_clear_routing(rc, weights, s.prompt + kDecodeSteps, seed + 1000 * i, &s.ref);
    EXPECT_EQ(static_cast<int64_t>(s.ids.size()), s.prompt + kDecodeSteps);
    out.push_back(std::move(s));
  }
  return out;
}

// Runs the batch: one prefill forward over every prompt (all positions' logits), then
// kDecodeSteps batched decode forwards. Returns per sequence the logits of every position, in
// order ([ids.size(), V] as doubles).
std::vector<std::vector<double>> run_batch(models::DeepseekV3ForCausalLM& m, const std::vector<Sequence>& seqs) {
  const int64_t V = m.config().vocab_size;
  std::vector<models::DeepseekV3Cache> caches;
  caches.reserve(seqs.size());
  for (const auto& s : seqs) caches.push_back(m.new_cache(static_cast<int64_t>(s.ids.size())));
  std::vector<std::vector<double>> out(seqs.size());

  std::vector<models::SequenceStep> prefill;
  for (size_t i = 0; i < seqs.size(); ++i)
    prefill.push_back({{seqs[i].ids.begin(), seqs[i].ids.begin() + seqs[i].prompt}, &caches[i]});
  const std::vector<double> all = to_doubles(m.forward(prefill, /*all_logits=*/true));
  size_t at = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const size_t n = static_cast<size_t>(seqs[i].prompt * V);
    out[i].assign(all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  EXPECT_EQ(at, all.size());

  for (int64_t step = 0; step < kDecodeSteps; ++step) {
    std::vector<models::SequenceStep> decode;
    for (size_t i = 0; i < seqs.size(); ++i) decode.push_back({{seqs[i].ids[seqs[i].prompt + step]}, &caches[i]});
    const std::vector<double> rows = to_doubles(m.forward(decode));
    EXPECT_EQ(rows.size(), seqs.size() * static_cast<size_t>(V));
    for (size_t i = 0; i < seqs.size(); ++i)
      out[i].insert(out[i].end(), rows.begin() + static_cast<std::ptrdiff_t>(i * V),
                    rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
  }
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(caches[i].length(), static_cast<int64_t>(seqs[i].ids.size()));
  return out;
}

// The LD run must really be partitioned: enabled plans and weight bytes in both domains.
void expect_partitioned(const runtime::LoadedModel& lm) {
  ASSERT_EQ(lm.topology.num_domains, 2);
  std::vector<modules::PlanRecord> plans;
  lm.model->collect_plans(&plans);
  int enabled = 0;
  for (const auto& p : plans) enabled += p.plan.enabled;
  EXPECT_GT(enabled, 0);
  const auto mem = lm.model->memory();
  for (int d = 0; d < 2; ++d) EXPECT_GT(mem.domain_bytes(d), 0) << "domain " << d;
}

void check_model(bool nvfp4) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << (nvfp4 ? "NVFP4" : "BF16") << ", model seed " << tiny_model_seed()
                                    << ", ids seed " << seed);
  const std::string& dir = tiny_model_dir(nvfp4, kRefInitStd);
  auto cpu = load_model(dir, 0);
  const auto seqs = make_sequences(dir, cpu.config, seed);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const auto on_cpu = run_batch(*cpu.model, seqs);

  std::vector<std::vector<double>> by_domains[2];
  for (int domains : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "CUDA, locality domains " << (domains ? "on (2)" : "off"));
    ScopedPoisonedAllocations poison;
    auto gpu = load_model(dir, domains, "cuda");
    ASSERT_EQ(gpu.device, kDev);
    if (domains) expect_partitioned(gpu);
    EXPECT_EQ(device_cache_total(kDev).cached_bytes, 0);  // the loader gave its staging memory back
    const auto on_gpu = run_batch(*gpu.model, seqs);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const double err_ref = rel_error(on_gpu[i], seqs[i].ref), err_cpu = rel_error(on_gpu[i], on_cpu[i]);
      std::cout << "[ info     ] " << (nvfp4 ? "NVFP4" : "BF16") << " LD " << (domains ? "on " : "off") << " seq " << i
                << ": rel error vs fp64 " << err_ref << ", vs CPU " << err_cpu << "\n";
      EXPECT_LT(err_ref, kBf16ModelTolerance) << "sequence " << i;
      // Both backends are within the BF16 budget of the same fp64 logits.
      EXPECT_LT(err_cpu, kBf16ModelTolerance) << "sequence " << i;
    }
    by_domains[domains ? 1 : 0] = on_gpu;
  }
  for (size_t i = 0; i < seqs.size(); ++i)
    EXPECT_LT(rel_error(by_domains[1][i], by_domains[0][i]), kBf16ModelTolerance) << "LD on vs off, sequence " << i;
}

TEST(CudaModel, Bf16BatchPrefillAndDecodeMatchFp64AndCpuLdOffAndOn) { check_model(false); }
TEST(CudaModel, Nvfp4BatchPrefillAndDecodeMatchFp64AndCpuLdOffAndOn) { check_model(true); }

// The Generator on a CUDA model (LD on): a batch of prompts, greedy. Each token it picked must be
// the CPU model's greedy choice for the same prefix, up to logits that BF16 rounding could swap.
TEST(CudaModel, GeneratorOnCudaPicksTheCpuGreedyTokens) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "model seed " << tiny_model_seed() << ", ids seed " << seed);
  const std::string& dir = tiny_model_dir(false);
  auto gpu = load_model(dir, 2, "cuda");
  auto cpu = load_model(dir, 0);
  const int64_t V = cpu.config.vocab_size;
  std::vector<runtime::GenerationRequest> reqs(2);
  reqs[0].prompt = random_ids(6, V, seed);
  reqs[1].prompt = random_ids(3, V, seed + 1);
  for (auto& r : reqs) r.max_new_tokens = 5;
  runtime::KvCacheManager kv(gpu.config, gpu.device, {64 << 20, "test"}, 2, 256);
  runtime::Generator gen(*gpu.model, kv, {});
  runtime::GenerationStats st;
  const auto results = gen.generate(reqs, {}, &st);
  EXPECT_EQ(kv.live_sequences(), 0);
  EXPECT_EQ(st.decode_steps, 4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "sequence " << i);
    ASSERT_EQ(results[i].tokens.size(), 5u);
    EXPECT_EQ(results[i].finish_reason, "length");
    std::vector<int32_t> full = reqs[i].prompt;
    full.insert(full.end(), results[i].tokens.begin(), results[i].tokens.end() - 1);
    const Tensor logits = prefill_logits(*cpu.model, full);
    const int64_t P = static_cast<int64_t>(reqs[i].prompt.size());
    for (int64_t k = 0; k < 5; ++k) {
      const float* row = logits.data<float>() + (P - 1 + k) * V;
      double mx = row[0], ss = 0;
      for (int64_t v = 0; v < V; ++v) {
        mx = std::max<double>(mx, row[v]);
        ss += static_cast<double>(row[v]) * row[v];
      }
      const double slack = 2 * kBf16ModelTolerance * std::sqrt(ss / static_cast<double>(V));
      EXPECT_GE(row[results[i].tokens[k]], mx - slack) << "token " << k << " = " << results[i].tokens[k];
    }
  }
}

}  // namespace
}  // namespace locus::testing
