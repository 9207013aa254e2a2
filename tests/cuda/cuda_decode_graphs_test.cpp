// Decode steps from device tables and their CUDA graphs: ops::kv_append_rows and
// ops::mla_attention_table against the CPU (poisoned outputs), a captured graph following its
// table's contents at replay, captured scratch kept away from later allocations, and
// runtime::DecodeGraphs on the tiny model: replays equal the same step run eagerly from the
// tables (bitwise), logits within the BF16 budget of eager forwards, and a key whose step reads
// back to the host declined with the reason.
#include <gtest/gtest.h>

#include "backends/cuda/cuda_graph.h"
#include "cuda_test_util.h"
#include "models/model_test_util.h"
#include "modules/mla_attention_reference.h"
#include "modules/moe.h"
#include "ops/host_upload.h"
#include "ops/kv_table.h"
#include "ops/norm.h"
#include "runtime/batch_stepper.h"
#include "runtime/decode_graphs.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"

namespace locus::testing {
namespace {

const Device kDev = Device::cuda(0);

// Latent caches of the given lengths at DeepSeek-V3's sizes (random rows, NaN past them and 2
// spare rows), on the CPU and the GPU, with a table of each.
struct TableCaches {
  static constexpr int64_t kDc = 512, kDr = 64, kWidth = kDc + kDr;
  std::vector<Tensor> cpu, gpu;
  ops::KvTable cpu_table, gpu_table;
  TableCaches(const std::vector<int64_t>& lens, uint64_t seed) {
    const int64_t B = static_cast<int64_t>(lens.size());
    Tensor rows_cpu = Tensor::empty({B}, DType::kI64), rows_gpu = Tensor::empty({B}, DType::kI64);
    Tensor lengths = Tensor::empty({B}, DType::kI32);
    int64_t most = 0;
    for (int64_t b = 0; b < B; ++b) {
      Tensor c = randn({lens[b] + 2, kWidth}, DType::kBF16, seed + static_cast<uint64_t>(b));
      c.slice(0, lens[b], lens[b] + 2).fill_nan_();
      cpu.push_back(c);
      gpu.push_back(to_gpu(c));
      rows_cpu.data<int64_t>()[b] = reinterpret_cast<intptr_t>(cpu.back().data_ptr());
      rows_gpu.data<int64_t>()[b] = reinterpret_cast<intptr_t>(gpu.back().data_ptr());
      lengths.data<int32_t>()[b] = static_cast<int32_t>(lens[b]);
      most = std::max(most, lens[b]);
    }
    cpu_table = {rows_cpu, lengths, kWidth, runtime::DecodeGraphs::key_bound(most)};
    gpu_table = {to_gpu(rows_gpu), to_gpu(lengths), kWidth, cpu_table.max_keys};
  }
};

TEST(CudaKvTable, AppendAndAttentionMatchTheCpu) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const std::vector<int64_t> lens = {0, 9, 130, 1500, 33};
  const int64_t B = static_cast<int64_t>(lens.size()), H = 128;
  TableCaches c(lens, seed);
  const Tensor src = randn({B, TableCaches::kWidth}, DType::kBF16, seed + 100);
  ops::kv_append_rows(src, c.cpu_table);
  ops::kv_append_rows(to_gpu(src), c.gpu_table);
  for (int64_t b = 0; b < B; ++b) EXPECT_TRUE(bitwise_equal(fetch(c.gpu[b]), c.cpu[b])) << "cache " << b;

  const Tensor q_lat = randn({B, H, TableCaches::kDc}, DType::kBF16, seed + 101);
  const Tensor q_pe = randn({B, H, TableCaches::kDr}, DType::kBF16, seed + 102);
  const float scale = 0.06f;
  Tensor cpu_out = Tensor::empty({B, H, TableCaches::kDc}, DType::kBF16);
  cpu_out.fill_nan_();
  ops::mla_attention_table(q_lat, q_pe, c.cpu_table, cpu_out, scale);
  for (int64_t max_keys : {kTensorCoreAttention, kDecodeKernelAttention}) {  // each attention kernel
    DecodeAttentionKeys kernel(max_keys);
    Tensor out = poisoned_gpu({B, H, TableCaches::kDc}, DType::kBF16);
    ops::mla_attention_table(to_gpu(q_lat), to_gpu(q_pe), c.gpu_table, out, scale);
    const Tensor got = fetch(out);
    for (int64_t b = 0; b < B; ++b) {
      const Tensor keys = c.cpu[b].slice(0, 0, lens[b] + 1);
      const Tensor kv = keys.slice(1, 0, TableCaches::kDc).unsqueeze(1);
      const auto ref = ref_attention(q_lat.slice(0, b, b + 1), q_pe.slice(0, b, b + 1), kv,
                                     keys.slice(1, TableCaches::kDc, TableCaches::kWidth).unsqueeze(1), kv, scale,
                                     lens[b]);
      const double tol = attention_tolerance(DType::kBF16, TableCaches::kWidth, lens[b] + 1);
      EXPECT_LT(rel_error(got.slice(0, b, b + 1), ref), tol) << "sequence " << b << ", max_keys " << max_keys;
      EXPECT_LT(rel_error(got.slice(0, b, b + 1), to_doubles(cpu_out.slice(0, b, b + 1))), 2 * tol)
          << "sequence " << b << ", max_keys " << max_keys;
    }
  }
}

TEST(CudaKvTable, AGraphReadsTheTableAtEachReplay) {
  LOCUS_REQUIRE_GPU();
  // Captured over one set of caches and lengths, replayed after the table was rewritten to point
  // at other caches with other lengths (same key bound): the output is the new caches' attention.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t H = 16;
  TableCaches first({40, 3}, seed), second({17, 60}, seed + 10);
  const Tensor q_lat = to_gpu(randn({2, H, TableCaches::kDc}, DType::kBF16, seed + 20));
  const Tensor q_pe = to_gpu(randn({2, H, TableCaches::kDr}, DType::kBF16, seed + 21));
  ops::KvTable table = first.gpu_table;  // the graph's own table buffers
  table.rows = first.gpu_table.rows.clone();
  table.lengths = first.gpu_table.lengths.clone();
  Tensor out = poisoned_gpu({2, H, TableCaches::kDc}, DType::kBF16);
  void* stream = cuda::create_capture_stream(0);
  cuda::Graph graph;
  graph.begin_capture(stream);
  ops::mla_attention_table(q_lat, q_pe, table, out, 0.1f, Stream{kDev, stream});
  graph.end_capture();
  for (TableCaches* c : {&first, &second, &first}) {
    table.rows.copy_(c->gpu_table.rows);
    table.lengths.copy_(c->gpu_table.lengths);
    graph.replay(stream);
    Tensor want = poisoned_gpu({2, H, TableCaches::kDc}, DType::kBF16);
    ops::mla_attention_table(q_lat, q_pe, c->gpu_table, want, 0.1f, Stream{kDev, stream});
    EXPECT_TRUE(bitwise_equal(fetch(out), fetch(want)));
  }
  graph = cuda::Graph();
  cuda::destroy_stream(stream);
}

TEST(CudaHostUpload, AGraphCopiesTheStagingAsItIsAtEachReplay) {
  LOCUS_REQUIRE_GPU();
  Tensor staging = ops::host_staging({1000}, DType::kI32, kDev);
  Tensor dst = poisoned_gpu({1000}, DType::kI32);
  void* stream = cuda::create_capture_stream(0);
  cuda::Graph graph;
  graph.begin_capture(stream);
  ops::upload(staging, dst, Stream{kDev, stream});
  graph.end_capture();
  for (int round = 0; round < 3; ++round) {
    ops::synchronize(kDev, Stream{kDev, stream});  // the last replay has read the staging
    for (int i = 0; i < 1000; ++i) staging.data<int32_t>()[i] = round * 1000 + i;
    graph.replay(stream);
    EXPECT_TRUE(bitwise_equal(fetch(dst), staging)) << "round " << round;
  }
  graph = cuda::Graph();
  cuda::destroy_stream(stream);
}

// Staging is copied by a kernel through its mapped address, in the widest unit that the addresses
// and the size allow; ordinary host memory goes through cudaMemcpyAsync. Every byte lands either way.
TEST(CudaHostUpload, EverySizeAlignmentAndSourceKindLands) {
  LOCUS_REQUIRE_GPU();
  Tensor staging = ops::host_staging({4099}, DType::kU8, kDev);
  Tensor pageable = Tensor::empty({4099}, DType::kU8);
  for (int i = 0; i < 4099; ++i) staging.data<uint8_t>()[i] = pageable.data<uint8_t>()[i] = static_cast<uint8_t>((i * 7 + 3) % 255);  // never the poison byte 0xFF
  for (const Tensor* src : {&staging, &pageable})
    for (int64_t offset : {0, 1, 4, 8, 16})
      for (int64_t n : {1, 3, 16, 100, 4080}) {
        Tensor from = src->slice(0, offset, offset + n);
        Tensor dst = poisoned_gpu({n}, DType::kU8);
        ops::upload(from, dst, Stream{kDev, nullptr});
        ops::synchronize(kDev);
        EXPECT_TRUE(bitwise_equal(fetch(dst), from)) << (src == &staging ? "staging" : "pageable") << " offset "
                                                     << offset << " bytes " << n;
      }
}

TEST(CudaGraphMemory, ScratchFreedDuringACaptureServesItThenStaysWithTheGraph) {
  LOCUS_REQUIRE_GPU();
  void* stream = cuda::create_capture_stream(0);
  cuda::Graph graph;
  void* scratch_ptr = nullptr;
  Tensor out = poisoned_gpu({1024}, DType::kFP32);
  graph.begin_capture(stream);
  for (int layer = 0; layer < 3; ++layer) {  // each "layer" frees its scratch before the next takes one
    Tensor scratch = Tensor::empty({1 << 20}, DType::kFP32, kDev);
    if (layer == 0) scratch_ptr = scratch.data_ptr();
    EXPECT_EQ(scratch.data_ptr(), scratch_ptr) << "layer " << layer << " did not reuse the capture's freed block";
    ops::add(out, out, scratch.slice(0, 0, 1024), Stream{kDev, stream});
    ops::cast(scratch.slice(0, 0, 1024), out, Stream{kDev, stream});
  }
  graph.end_capture();
  // A block of the same class handed out now must not be the graph's scratch.
  std::vector<Tensor> later;
  for (int i = 0; i < 4; ++i) {
    later.push_back(Tensor::empty({1 << 20}, DType::kFP32, kDev));
    EXPECT_NE(later.back().data_ptr(), scratch_ptr) << "allocation " << i << " reuses the graph's scratch";
  }
  later.clear();
  graph = cuda::Graph();  // the graph is gone: its scratch goes back to the cache
  bool reused = false;
  for (int i = 0; i < 8 && !reused; ++i) {
    later.push_back(Tensor::empty({1 << 20}, DType::kFP32, kDev));
    reused = later.back().data_ptr() == scratch_ptr;
  }
  EXPECT_TRUE(reused) << "the scratch never came back to the cache";
  cuda::destroy_stream(stream);
}

// Decode steps of two sequences through DecodeGraphs against the same steps run eagerly by
// forward_on_device on copies of the caches.
void check_graphs_follow_eager(bool nvfp4, int64_t batch, int domains = 0) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << (nvfp4 ? "NVFP4" : "BF16") << ", batch " << batch << ", domains " << domains
                                    << ", seed " << seed);
  auto gpu = load_model(tiny_model_dir(nvfp4), domains, "cuda");
  auto& m = *gpu.model;
  const int64_t V = gpu.config.vocab_size;
  std::vector<models::DeepseekV3Cache> g, e;
  for (int64_t b = 0; b < batch; ++b) {
    g.push_back(m.new_cache(128));
    e.push_back(m.new_cache(128));
    const auto prompt = random_ids(5 + 3 * b, V, seed + static_cast<uint64_t>(b));
    m.forward({{prompt, &g.back()}});
    m.forward({{prompt, &e.back()}});
  }
  runtime::DecodeGraphs graphs(m);
  for (int step = 0; step < 5; ++step) {
    const auto ids = random_ids(batch, V, seed + 100 + static_cast<uint64_t>(step));
    std::vector<models::SequenceStep> gs, es;
    for (int64_t b = 0; b < batch; ++b) {
      gs.push_back({{ids[static_cast<size_t>(b)]}, &g[static_cast<size_t>(b)]});
      es.push_back({{ids[static_cast<size_t>(b)]}, &e[static_cast<size_t>(b)]});
    }
    const Tensor want = fetch(m.forward_on_device(es));
    const Tensor got_dev = graphs.step(gs);
    if (!got_dev.defined()) {  // declined: nothing ran; run it eagerly as BatchStepper does
      ASSERT_FALSE(graphs.stats().capture_failure.empty());
      m.forward_on_device(gs);
      continue;
    }
    const Tensor got = fetch(got_dev);
    EXPECT_LT(rel_error(got, to_doubles(want)), kBf16ModelTolerance) << "step " << step;
    if (step >= 1) EXPECT_EQ(graphs.stats().replays, step) << "steps after the first are replays";
    for (int64_t b = 0; b < batch; ++b) EXPECT_EQ(g[static_cast<size_t>(b)].length(), e[static_cast<size_t>(b)].length());
  }
}

TEST(CudaDecodeGraphs, Nvfp4BatchOneIsRecordedAndReplaysMatchEager) {
  LOCUS_REQUIRE_GPU();
  // The tiny model's MoE (8 experts, top 2) takes NVFP4 experts by id at one token: capturable.
  check_graphs_follow_eager(true, 1);
  // Locality domains on: the partitioned ops' fork/joins over the domains' green-context streams
  // are captured too.
  check_graphs_follow_eager(true, 1, 2);
}

TEST(CudaDecodeGraphs, AStepThatReadsBackIsDeclinedWithTheReason) {
  LOCUS_REQUIRE_GPU();
  // BF16 experts are grouped, which reads expert offsets back to the host: the capture fails, the
  // key is declined, and the steps run eagerly.
  check_graphs_follow_eager(false, 2);
}

// The tiny NVFP4 model on the GPU and two caches holding the same prompt: `a` for the graphs, `b`
// for the eager twin of each step.
struct TwinCaches {
  runtime::LoadedModel gpu = load_model(tiny_model_dir(true), 0, "cuda");
  models::DeepseekV3ForCausalLM& m = *gpu.model;
  const int64_t V = gpu.config.vocab_size;
  models::DeepseekV3Cache a = m.new_cache(128), b = m.new_cache(128);
  TwinCaches(int64_t prompt_length, uint64_t seed) {
    const auto prompt = random_ids(prompt_length, V, seed);
    m.forward({{prompt, &a}});
    m.forward({{prompt, &b}});
  }
  // The decode step of token `id` over b, eagerly through forward_decode_table (fetched logits).
  Tensor eager_table_step(int32_t id) {
    const int64_t L = gpu.config.num_hidden_layers;
    Tensor rows = Tensor::empty({L, 1}, DType::kI64), small = Tensor::empty({2}, DType::kI32);
    for (int64_t l = 0; l < L; ++l)
      rows.data<int64_t>()[l] = reinterpret_cast<intptr_t>(b.layers[static_cast<size_t>(l)].latent.data_ptr());
    small.data<int32_t>()[0] = id;
    small.data<int32_t>()[1] = static_cast<int32_t>(b.length());
    const Tensor small_gpu = to_gpu(small);
    const models::DecodeTables t{small_gpu.slice(0, 0, 1), small_gpu.slice(0, 1, 2), to_gpu(rows),
                                 runtime::DecodeGraphs::key_bound(b.length())};
    const Tensor logits = fetch(m.forward_decode_table(t));
    for (auto& layer : b.layers) ++layer.length;
    return logits;
  }
};

TEST(CudaDecodeGraphs, AReplayAfterAnInPlaceReloadUsesTheNewWeights) {
  LOCUS_REQUIRE_GPU();
  // lm_head (BF16) and layer 0's o_proj reloaded in place after the graph was recorded: the next
  // replay (no new record) gives the new weights' logits, far from the old ones.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  TwinCaches twin(5, seed);
  auto& [gpu, m, V, a, b] = twin;
  const int64_t D = gpu.config.hidden_size;
  runtime::DecodeGraphs graphs(m);
  for (int step = 0; step < 2; ++step) {
    const int32_t id = random_ids(1, V, seed + 10 + static_cast<uint64_t>(step))[0];
    m.forward({{{id}, &b}});
    ASSERT_TRUE(graphs.step({{{id}, &a}}).defined());
  }
  const int32_t id = random_ids(1, V, seed + 20)[0];
  const Tensor o_proj = m.layer(0).self_attn().o_proj().weight();
  const Tensor old_logits = fetch(m.forward_on_device({{{id}, &b}}));
  for (auto& layer : b.layers) --layer.length;  // that step again, with the new weights
  m.reload({{"lm_head.weight", randn({V, D}, DType::kBF16, seed + 21)},
            {"model.layers.0.self_attn.o_proj.weight", randn(o_proj.shape(), DType::kBF16, seed + 22, 0.05)}});
  const Tensor want = fetch(m.forward_on_device({{{id}, &b}}));
  const Tensor got = fetch(graphs.step({{{id}, &a}}));
  EXPECT_LT(rel_error(got, to_doubles(want)), kBf16ModelTolerance);
  EXPECT_GT(rel_error(got, to_doubles(old_logits)), 0.5) << "the replay still used the old weights";
  EXPECT_EQ(graphs.stats().recorded, 1);
  EXPECT_EQ(graphs.stats().replays, 2);
}

TEST(CudaDecodeGraphs, ReplaysAreTheEagerTableStepBitwise) {
  LOCUS_REQUIRE_GPU();
  // The same step (tokens, caches) through a replay and eagerly through forward_decode_table.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  TwinCaches twin(6, seed);
  auto& [gpu, m, V, a, b] = twin;
  runtime::DecodeGraphs graphs(m);
  for (int step = 0; step < 4; ++step) {
    const int32_t id = random_ids(1, V, seed + 10 + static_cast<uint64_t>(step))[0];
    const Tensor want = twin.eager_table_step(id);
    const Tensor got = graphs.step({{{id}, &a}});
    ASSERT_TRUE(got.defined());
    EXPECT_TRUE(bitwise_equal(fetch(got), want)) << "step " << step;
  }
  EXPECT_EQ(graphs.stats().recorded, 1);
  EXPECT_EQ(graphs.stats().replays, 3);
}

TEST(CudaDecodeGraphs, ChainedStepsAreTheTableStepsOfTheDeviceTokens) {
  LOCUS_REQUIRE_GPU();
  // Each chained step is launched before the last step's greedy tokens are read back; it must be
  // the eager table step of those tokens, bitwise, and leave the caches at the same lengths.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  TwinCaches twin(7, seed);
  auto& [gpu, m, V, a, b] = twin;
  runtime::DecodeGraphs graphs(m);
  int32_t id = random_ids(1, V, seed + 10)[0];
  Tensor got = graphs.step({{{id}, &a}});
  Tensor want = twin.eager_table_step(id);
  ASSERT_TRUE(bitwise_equal(fetch(got), want));
  for (int step = 0; step < 6; ++step) {
    auto tokens = graphs.greedy_tokens(got);
    got = graphs.step_chained({{{0}, &a}});  // queued behind the tokens' copy, before it is read
    ASSERT_TRUE(got.defined()) << "step " << step;
    id = tokens.wait()[0];
    EXPECT_EQ(id, runtime::argmax_rows(want)[0]) << "step " << step;
    want = twin.eager_table_step(id);
    EXPECT_TRUE(bitwise_equal(fetch(got), want)) << "step " << step;
    EXPECT_EQ(a.length(), b.length());
  }
  EXPECT_EQ(graphs.stats().chained, 6);
}

TEST(CudaDecodeGraphs, LookaheadGivesTheTokensOfStepsThatWaitForTheHost) {
  LOCUS_REQUIRE_GPU();
  // Greedy batches through BatchStepper with graphs, lookahead off and on (fresh caches each):
  // the same kernels run in the same order, so the tokens are the same.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  auto gpu = load_model(tiny_model_dir(true), 0, "cuda");
  auto& m = *gpu.model;
  runtime::KvCacheManager kv{gpu.config, gpu.device, {64 << 20, "test"}, 4, 256};
  const int64_t V = gpu.config.vocab_size;
  std::vector<std::vector<std::vector<int32_t>>> runs;
  int64_t chained = 0;
  for (bool lookahead : {false, true}) {
    runtime::DecodeGraphs graphs(m);
    runtime::BatchStepper stepper(m, kv, {}, &graphs);
    stepper.set_lookahead(lookahead);
    std::vector<std::vector<int32_t>> tokens(2);
    stepper.add({random_ids(5, V, seed), 20, {}});
    stepper.add({random_ids(9, V, seed + 1), 14, {}});
    while (!stepper.empty())
      for (auto& f : stepper.step()) tokens[f.key] = f.result.tokens;
    runs.push_back(tokens);
    chained = graphs.stats().chained;
  }
  EXPECT_EQ(runs[1], runs[0]);
  EXPECT_GT(chained, 5);
  EXPECT_EQ(kv.live_sequences(), 0);
}

}  // namespace
}  // namespace locus::testing
