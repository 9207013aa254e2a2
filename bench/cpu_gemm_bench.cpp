// CPU GEMM throughput (GFLOP/s) at DeepSeek-like decode (M = 1..16) and prefill (M = 128)
// shapes, BF16 and NVFP4 weights. Threads: LOCUS_NUM_THREADS or all cores (the global pool).
#include <benchmark/benchmark.h>

#include <random>

#include "backends/cpu/dot_kernel.h"
#include "core/float_convert.h"
#include "ops/gemm.h"
#include "ops/nvfp4.h"

namespace {

using locus::DType;
using locus::Tensor;

Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed, float scale) {
  Tensor t = Tensor::empty({rows, cols}, DType::kBF16);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  uint16_t* p = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = locus::f32_to_bf16_bits(d(rng));
  return t;
}

void set_counters(benchmark::State& state, int64_t m, int64_t n, int64_t k, double weight_bytes) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] = benchmark::Counter(weight_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(locus::cpu::detail::dot_kernel_isa());
}

void BM_GemmBf16(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor x = random_bf16(m, k, 1, 1.f), w = random_bf16(n, k, 2, 0.02f);
  Tensor y = Tensor::empty({m, n}, DType::kBF16);
  for (auto _ : state) {
    locus::ops::gemm(x, w, Tensor(), y);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_counters(state, m, n, k, 2.0 * n * k);
}

void BM_GemmNvfp4(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor x = random_bf16(m, k, 1, 1.f);
  locus::ops::Nvfp4Weight w = locus::ops::nvfp4_quantize(random_bf16(n, k, 2, 0.02f));
  Tensor y = Tensor::empty({m, n}, DType::kBF16);
  for (auto _ : state) {
    locus::ops::nvfp4_gemm(x, w, Tensor(), y);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_counters(state, m, n, k, n * k * 0.5625);
}

// {M, N, K}: q_a_proj-like (N 1536, K 7168) and an MoE expert gate/up (N 2048 x 2, K 7168).
void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 4, 16, 128}) {
    b->Args({m, 1536, 7168});
    b->Args({m, 4096, 7168});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_GemmBf16)->Apply(Shapes);
BENCHMARK(BM_GemmNvfp4)->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
