// Serving throughput on the CPU backend with the tiny model: N requests of 32 new tokens each,
// run through the BatchingEngine one at a time (max_batch 1) or all at once (continuous
// batching, max_batch 8). Counter: generated tokens per second. Threads: LOCUS_NUM_THREADS or all
// cores.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <memory>
#include <random>
#include <unistd.h>

#include "models/tiny_model.h"
#include "runtime/generation_stack.h"
#include "serve/batching_engine.h"

namespace {

constexpr int64_t kNewTokens = 32;

// The tiny model, written to a temporary directory and loaded once.
struct TinyServing {
  std::filesystem::path dir;
  std::unique_ptr<locus::runtime::GenerationStack> stack;
  TinyServing() {
    dir = std::filesystem::temp_directory_path() / ("locus_serve_bench_" + std::to_string(::getpid()));
    locus::models::TinyModelOptions o;
    o.seed = 1;
    locus::models::write_tiny_model(dir.string(), o);
    locus::runtime::LlmArgs args;
    args.model = dir.string();
    args.max_batch_size = 16;
    args.max_seq_len = 256;
    args.kv_cache_budget_bytes = 256 << 20;
    locus::runtime::ModelLoaderOptions lo;
    lo.progress = false;
    lo.log = nullptr;
    stack = locus::runtime::GenerationStack::load(args, lo, "serve_batching_bench");
  }
  ~TinyServing() { std::filesystem::remove_all(dir); }
};

TinyServing& tiny() {
  static TinyServing t;
  return t;
}

std::vector<locus::runtime::GenerationRequest> requests(int n) {
  std::mt19937_64 rng(7);
  std::vector<locus::runtime::GenerationRequest> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt(8 + i % 5);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 256);
    out.push_back({prompt, kNewTokens, {0.8, 0, 1.0, static_cast<uint64_t>(i)}});
  }
  return out;
}

void run(benchmark::State& state, int max_batch) {
  TinyServing& t = tiny();
  const auto reqs = requests(static_cast<int>(state.range(0)));
  locus::serve::BatchingEngine engine(*t.stack->model.model, *t.stack->kv, {}, max_batch);
  for (auto _ : state) {
    std::vector<std::future<locus::runtime::GenerationResult>> done;
    for (const auto& r : reqs) done.push_back(engine.submit({r, {}, {}}));
    for (auto& f : done) benchmark::DoNotOptimize(f.get().tokens.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(reqs.size() * kNewTokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["max_batch_seen"] = engine.max_batch_seen();
}

void BM_ServeOneAtATime(benchmark::State& state) { run(state, 1); }
void BM_ServeContinuousBatching(benchmark::State& state) { run(state, 8); }

BENCHMARK(BM_ServeOneAtATime)->Arg(1)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ServeContinuousBatching)->Arg(1)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
