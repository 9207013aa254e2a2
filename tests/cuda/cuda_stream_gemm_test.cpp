// The weight-streaming skinny GEMM (backends/cuda/stream_gemm.h) and its single-launch
// locality-domain form: BF16 and NVFP4, plain and fused SwiGLU, bias, column slices, every M
// block size, determinism, domain-aware launches over green-context partitions, work stealing
// from domains without SMs, graph capture and in-place reload, chained (programmatic dependent)
// launches. References in fp64.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "backends/cuda/stream_gemm.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

// Puts the streaming kernel's default tuning back when a test that forces one ends.
struct RestoreDefaultTuning {
  ~RestoreDefaultTuning() { cuda::detail::set_stream_gemm_tuning({}); }
};

struct Bf16Case {
  int64_t m, n, k;
  DType out;
  int bias;  // 0 none, 1 bf16, 2 fp32
};

class CudaStreamGemmBf16 : public ::testing::TestWithParam<Bf16Case> {};

TEST_P(CudaStreamGemmBf16, MatchesFp64) {
  LOCUS_REQUIRE_GPU();
  const Bf16Case c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << c.m << " N " << c.n << " K " << c.k);
  Tensor x = randn({c.m, c.k}, DType::kBF16, seed);
  Tensor w = randn({c.n, c.k}, DType::kBF16, seed + 1, 0.05);
  Tensor bias;
  if (c.bias) bias = randn({c.n}, c.bias == 1 ? DType::kBF16 : DType::kFP32, seed + 2);
  // y is a column slice of a wider poisoned tensor: the columns around it must stay NaN.
  Tensor wide = poisoned_gpu({c.m, c.n + 24}, c.out);
  Tensor y = wide.slice(1, 8, 8 + c.n);
  ASSERT_TRUE(cuda::stream_gemm(to_gpu(x), to_gpu(w), bias.defined() ? to_gpu(bias) : Tensor(), y, false, nullptr));
  Tensor out = fetch(wide);
  const double tol = c.out == DType::kBF16 ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k);
  EXPECT_LT(rel_error(out.slice(1, 8, 8 + c.n), ref_gemm(x, w, bias)), tol);
  EXPECT_TRUE(std::isnan(get(out, 0)) && std::isnan(get(out, c.n + 23))) << "columns outside y were written";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaStreamGemmBf16,
                         ::testing::Values(Bf16Case{1, 16, 8, DType::kBF16, 0}, Bf16Case{1, 40, 72, DType::kFP32, 1},
                                           Bf16Case{3, 576, 1536, DType::kBF16, 2},
                                           Bf16Case{8, 100, 7168, DType::kBF16, 0},
                                           Bf16Case{9, 256, 2048, DType::kFP32, 2},
                                           Bf16Case{16, 1000, 512, DType::kBF16, 1},
                                           Bf16Case{17, 48, 264, DType::kBF16, 0},
                                           Bf16Case{32, 520, 1024, DType::kFP32, 0}));

TEST(CudaStreamGemm, Bf16SwigluAnyIntermediateSize) {
  LOCUS_REQUIRE_GPU();
  for (auto [m, inter, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 256}, {7, 40, 512}, {16, 200, 1024}, {29, 24, 96}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " I " << inter << " K " << k);
    Tensor x = randn({m, k}, DType::kBF16, seed);
    Tensor w = randn({2 * inter, k}, DType::kBF16, seed + 1, 0.05);
    Tensor y = poisoned_gpu({m, inter}, DType::kBF16);
    ASSERT_TRUE(cuda::stream_gemm(to_gpu(x), to_gpu(w), Tensor(), y, true, nullptr));
    EXPECT_LT(rel_error(fetch(y), ref_swiglu(ref_gemm(x, w), m, inter)), bf16_gemm_tolerance(k));
  }
}

TEST(CudaStreamGemm, OutsideItsRangeItLaunchesNothing) {
  LOCUS_REQUIRE_GPU();
  Tensor w = Tensor::zeros({32, 64}, DType::kBF16, Device::cuda(0));
  Tensor y = poisoned_gpu({40, 32}, DType::kBF16);
  EXPECT_FALSE(cuda::stream_gemm(Tensor::zeros({40, 64}, DType::kBF16, Device::cuda(0)), w, {}, y, false, nullptr));
  Tensor w12 = Tensor::zeros({32, 12}, DType::kBF16, Device::cuda(0));  // K % 8 != 0
  EXPECT_FALSE(cuda::stream_gemm(Tensor::zeros({2, 12}, DType::kBF16, Device::cuda(0)), w12, {}, y.slice(0, 0, 2), false,
                                 nullptr));
  EXPECT_TRUE(std::isnan(get(fetch(y), 0)));
}

TEST(CudaStreamGemm, RepeatedRunsAreBitIdentical) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  const uint64_t seed = fresh_seed();
  // Large enough that K is split over several units per tile (partials + ordered reduction).
  const int64_t M = 5, N = 1024, K = 7168;
  Tensor xg = to_gpu(randn({M, K}, DType::kBF16, seed));
  Tensor wg = to_gpu(randn({N, K}, DType::kBF16, seed + 1, 0.05));
  ops::Nvfp4Weight fp4 = cuda::nvfp4_prepare(random_nvfp4(N, K, seed + 2), 0, -1);
  Tensor a = poisoned_gpu({M, N}, DType::kFP32), b = poisoned_gpu({M, N}, DType::kFP32);
  ASSERT_TRUE(cuda::stream_gemm(xg, wg, {}, a, false, nullptr));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(cuda::stream_gemm(xg, wg, {}, b, false, nullptr));
  EXPECT_TRUE(bitwise_equal(fetch(a), fetch(b)));
  cuda::nvfp4_gemm(xg, fp4, {}, a, nullptr);
  for (int i = 0; i < 5; ++i) cuda::nvfp4_gemm(xg, fp4, {}, b, nullptr);
  EXPECT_TRUE(bitwise_equal(fetch(a), fetch(b)));
}

// The traced kernel form (StreamGemmTuning::trace, for timelines: the stamps are compiled out of
// the form that normally runs) writes the same outputs, bitwise, and one record per CTA whose
// stamps are in order: start <= waited <= first chunk (when warp 0 had one) <= streamed <= end.
// Both feeds (cp.async rings, TMA producer).
TEST(CudaStreamGemm, TracedFormMatchesAndStampsInOrder) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  RestoreDefaultTuning restore;
  const uint64_t seed = fresh_seed();
  namespace cd = cuda::detail;
  const int64_t M = 3, N = 2048, K = 3072;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  const ops::Nvfp4Weight host = random_nvfp4(N, K, seed + 1);
  const ops::Nvfp4Weight fp4 = cuda::nvfp4_prepare(host, 0, -1);
  const Tensor xg = to_gpu(x);
  for (const int feed : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " feed " << feed);
    cd::StreamGemmTuning t;
    t.feed = feed;
    cd::set_stream_gemm_tuning(t);
    Tensor plain = poisoned_gpu({M, N}, DType::kFP32), traced = poisoned_gpu({M, N}, DType::kFP32);
    cuda::nvfp4_gemm(xg, fp4, {}, plain, nullptr);
    TraceRecords records(4096, cd::kStreamTraceWords);
    t.trace = records.trace();
    cd::set_stream_gemm_tuning(t);
    const uint64_t launches = cd::stream_gemm_feed_launches(feed);
    cuda::nvfp4_gemm(xg, fp4, {}, traced, nullptr);
    EXPECT_EQ(cd::stream_gemm_feed_launches(feed), launches + 1) << "the feed did not run";
    const auto recs = records.read();
    cd::set_stream_gemm_tuning({});
    const Tensor out = fetch(traced);
    EXPECT_LT(rel_error(out, ref_gemm_dense(x, dequant_ref(host), N, Tensor())), fp32_out_gemm_tolerance(K));
    EXPECT_TRUE(bitwise_equal(out, fetch(plain)));
    ASSERT_FALSE(recs.empty()) << "no CTA was traced";
    for (size_t i = 0; i < recs.size(); ++i) {
      const auto& r = recs[i];
      SCOPED_TRACE(::testing::Message() << "record " << i);
      EXPECT_GT(r[cd::kStreamTraceStart], 0u);
      EXPECT_LE(r[cd::kStreamTraceStart], r[cd::kStreamTraceWaited]);
      EXPECT_LE(r[cd::kStreamTraceWaited], r[cd::kStreamTraceStreamed]);
      EXPECT_LE(r[cd::kStreamTraceStreamed], r[cd::kStreamTraceEnd]);
      if (r[cd::kStreamTraceFirst] != 0) {
        EXPECT_LE(r[cd::kStreamTraceWaited], r[cd::kStreamTraceFirst]);
        EXPECT_LE(r[cd::kStreamTraceFirst], r[cd::kStreamTraceStreamed]);
      }
    }
  }
}

// Back-to-back launches in one stream, each reading the previous one's output: a programmatic
// dependent launch starts (and copies or prefetches weights) while the previous GEMM drains, so
// it must still wait for that GEMM's output. Eager and captured, against fp64 per layer and
// bitwise against plain stream order. NVFP4 and BF16 layers alternate, on either NVFP4 feed; and
// NVFP4 layers only on the TMA feed (its launches beside each other).
TEST(CudaStreamGemm, ChainedLaunchesReadThePreviousOutput) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  RestoreDefaultTuning restore;
  const uint64_t seed = fresh_seed();
  const int64_t M = 4, D = 3072;
  const int layers = 6;
  std::vector<ops::Nvfp4Weight> fp4_host(layers), fp4(layers);
  std::vector<Tensor> bf16_host(layers), bf16(layers);
  for (int i = 0; i < layers; ++i) {
    fp4_host[i] = random_nvfp4(D, D, seed + 10 * i);
    fp4[i] = cuda::nvfp4_prepare(fp4_host[i], 0, -1);
    bf16_host[i] = randn({D, D}, DType::kBF16, seed + 10 * i + 1, 1.0 / std::sqrt(static_cast<double>(D)));
    bf16[i] = to_gpu(bf16_host[i]);
  }
  std::vector<Tensor> y(layers + 1);
  y[0] = to_gpu(randn({M, D}, DType::kBF16, seed + 1000));
  for (int i = 1; i <= layers; ++i) y[i] = poisoned_gpu({M, D}, DType::kBF16);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{stream};
  for (auto [feed, all_nvfp4] : {std::pair{0, false}, {1, false}, {1, true}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " feed " << feed << (all_nvfp4 ? ", NVFP4 only" : ""));
    cuda::detail::StreamGemmTuning tuning;
    tuning.feed = feed;
    cuda::detail::set_stream_gemm_tuning(tuning);
    auto nvfp4_layer = [&](int i) { return all_nvfp4 || i % 2 == 0; };
    auto chain = [&] {
      for (int i = 0; i < layers; ++i) {
        if (nvfp4_layer(i)) cuda::nvfp4_gemm(y[i], fp4[i], {}, y[i + 1], stream);
        else ASSERT_TRUE(cuda::stream_gemm(y[i], bf16[i], {}, y[i + 1], false, stream));
      }
    };
    auto outputs = [&] {
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      std::vector<Tensor> out;
      for (int i = 1; i <= layers; ++i) out.push_back(fetch(y[i]));
      return out;
    };
    auto poison = [&] {
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (int i = 1; i <= layers; ++i) y[i].fill_nan_();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    };
    poison();
    const uint64_t tma_launches = cuda::detail::stream_gemm_feed_launches(1);
    chain();
    const std::vector<Tensor> eager = outputs();
    int nvfp4_layers = 0;
    for (int i = 0; i < layers; ++i) nvfp4_layers += nvfp4_layer(i) ? 1 : 0;
    // The TMA feed takes the NVFP4 layers (and only those); the cp.async kernel the rest.
    EXPECT_EQ(cuda::detail::stream_gemm_feed_launches(1) - tma_launches, feed == 1 ? nvfp4_layers : 0);
    Tensor in = fetch(y[0]);
    for (int i = 0; i < layers; ++i) {
      const std::vector<double> ref =
          nvfp4_layer(i) ? ref_gemm_dense(in, dequant_ref(fp4_host[i]), D) : ref_gemm(in, bf16_host[i]);
      EXPECT_LT(rel_error(eager[i], ref), bf16_gemm_tolerance(D)) << "layer " << i;
      in = eager[i];
    }
    cuda::Graph graph;
    graph.begin_capture(stream);
    chain();
    graph.end_capture();
    for (int rep = 0; rep < 2; ++rep) {
      poison();
      graph.replay(stream);
      const std::vector<Tensor> replayed = outputs();
      for (int i = 0; i < layers; ++i)
        EXPECT_TRUE(bitwise_equal(replayed[i], eager[i])) << "replay " << rep << " layer " << i;
    }
    tuning.dependent_launch = 0;
    cuda::detail::set_stream_gemm_tuning(tuning);
    poison();
    chain();
    const std::vector<Tensor> ordered = outputs();
    for (int i = 0; i < layers; ++i) EXPECT_TRUE(bitwise_equal(ordered[i], eager[i])) << "layer " << i;
  }
}

// Every work decomposition (whole rows; the stream-K cut at 1, 2 and 5 units per resident CTA,
// whose units end inside rows and touch up to 3 of them) with 8- and 4-warp CTAs gives the right
// answer, for BF16 and NVFP4, plain and SwiGLU, on shapes where the cut lands on and between row
// boundaries. (BF16 at M = 32 has no room for 8 warps: asked for, they run as 4.)
TEST(CudaStreamGemm, EveryWorkDecompositionMatchesFp64) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  RestoreDefaultTuning restore;
  const uint64_t seed = fresh_seed();
  // 32768 x 1024: 512 rows, so that with whole rows as units (units -1) a CTA takes several and
  // reuses its row slots after a unit that skipped the partials' fence.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4096, 7168}, {9, 200, 192}, {16, 1024, 1536},
                         {1, 32768, 1024}, {32, 512, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " N " << n << " K " << k);
    Tensor x = randn({m, k}, DType::kBF16, seed + n);
    Tensor w = randn({n, k}, DType::kBF16, seed + n + 1, 0.05);
    ops::Nvfp4Weight fp4 = random_nvfp4(n, k, seed + n + 2);
    const Tensor xg = to_gpu(x), wg = to_gpu(w);  // w is also a fused [gate; up] weight of n / 2 rows each
    const ops::Nvfp4Weight fp4g = cuda::nvfp4_prepare(fp4, 0, -1);
    const std::vector<double> ref = ref_gemm(x, w), ref_fp4 = ref_gemm_dense(x, dequant_ref(fp4), n, Tensor());
    const std::vector<double> ref_gated = ref_swiglu(ref, m, n / 2), ref_fp4_gated = ref_swiglu(ref_fp4, m, n / 2);
    for (auto [units, warps] : {std::pair{-1, 8}, {1, 8}, {2, 8}, {5, 8}, {-1, 4}, {1, 4}, {2, 4}, {5, 4}}) {
      SCOPED_TRACE(::testing::Message() << "units per CTA " << units << ", warps " << warps);
      cuda::detail::set_stream_gemm_tuning({units, warps});
      Tensor y = poisoned_gpu({m, n}, DType::kFP32);
      ASSERT_TRUE(cuda::stream_gemm(xg, wg, {}, y, false, nullptr));
      EXPECT_LT(rel_error(fetch(y), ref), fp32_out_gemm_tolerance(k));
      y = poisoned_gpu({m, n}, DType::kFP32);
      cuda::nvfp4_gemm(xg, fp4g, {}, y, nullptr);
      EXPECT_LT(rel_error(fetch(y), ref_fp4), fp32_out_gemm_tolerance(k));
      Tensor ys = poisoned_gpu({m, n / 2}, DType::kBF16);
      ASSERT_TRUE(cuda::stream_gemm(xg, wg, {}, ys, true, nullptr));
      EXPECT_LT(rel_error(fetch(ys), ref_gated), bf16_gemm_tolerance(k));
      if ((n / 2) % 16 == 0) {  // the fused NVFP4 form needs the up rows on a 16-row tile
        ys = poisoned_gpu({m, n / 2}, DType::kBF16);
        cuda::nvfp4_gemm_swiglu(xg, fp4g, ys, nullptr);
        EXPECT_LT(rel_error(fetch(ys), ref_fp4_gated), bf16_gemm_tolerance(k));
      }
    }
  }
}

// Domain-aware launches over two green-context partitions.
class CudaStreamDomains : public CudaTwoDomains {
 protected:
  // Rows [0, n0) on domain 0, [n0, n) on domain 1.
  std::vector<cuda::DomainSlice> slices(int64_t n0, int64_t n) const {
    return {{0, n0, parts_[0].stream}, {n0, n, parts_[1].stream}};
  }
};

TEST_F(CudaStreamDomains, Bf16ShardsInOneLaunchMatchTheWholeWeight) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (auto [M, N, K, n0] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 7168, 2048, 3584}, {8, 600, 1536, 296},
                             {16, 1024, 7168, 512}, {32, 96, 200, 40}}) {
    SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N << " K " << K);
    Tensor x = randn({M, K}, DType::kBF16, seed + M);
    Tensor w = randn({N, K}, DType::kBF16, seed + M + 1, 0.05);
    Tensor bias = randn({N}, DType::kFP32, seed + M + 2);
    Tensor s0 = w.slice(0, 0, n0).to(Device::cuda(0), 0), s1 = w.slice(0, n0, N).to(Device::cuda(0), 1);
    Tensor y = poisoned_gpu({M, N}, DType::kBF16);
    ASSERT_TRUE(cuda::gemm_domains(to_gpu(x), {s0, s1}, to_gpu(bias), y, false, slices(n0, N), caller_));
    EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w, bias)), bf16_gemm_tolerance(K));
  }
}

TEST_F(CudaStreamDomains, Bf16SwigluShardsKeepGateAndUpTogether) {
  const uint64_t seed = fresh_seed();
  const int64_t M = 4, I = 96, K = 512, i0 = 40;  // partition 0: intermediate columns [0, 40)
  Tensor x = randn({M, K}, DType::kBF16, seed);
  Tensor gate = randn({I, K}, DType::kBF16, seed + 1, 0.05), up = randn({I, K}, DType::kBF16, seed + 2, 0.05);
  auto shard = [&](int64_t a, int64_t b, int domain) {
    Tensor s = Tensor::empty({2 * (b - a), K}, DType::kBF16);
    s.slice(0, 0, b - a).copy_(gate.slice(0, a, b));
    s.slice(0, b - a, 2 * (b - a)).copy_(up.slice(0, a, b));
    return s.to(Device::cuda(0), domain);
  };
  Tensor y = poisoned_gpu({M, I}, DType::kBF16);
  ASSERT_TRUE(cuda::gemm_domains(to_gpu(x), {shard(0, i0, 0), shard(i0, I, 1)}, Tensor(), y, true, slices(i0, I), caller_));
  Tensor full = Tensor::empty({2 * I, K}, DType::kBF16);
  full.slice(0, 0, I).copy_(gate);
  full.slice(0, I, 2 * I).copy_(up);
  EXPECT_LT(rel_error(fetch(y), ref_swiglu(ref_gemm(x, full), M, I)), bf16_gemm_tolerance(K));
}

// M = 3 runs the streaming kernel, M = 56 the wgmma one (nvfp4_wgmma.h).
TEST_F(CudaStreamDomains, Nvfp4ShardsInOneLaunchCaptureAndReload) {
  for (const int64_t M : {3, 56}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << M);
    const int64_t N = 3072, K = 2048, n0 = 1024;
    ops::Nvfp4Weight w = random_nvfp4(N, K, seed);
    ops::Nvfp4Weight d0 = cuda::nvfp4_prepare(ops::nvfp4_rows(w, 0, n0), 0, 0);
    ops::Nvfp4Weight d1 = cuda::nvfp4_prepare(ops::nvfp4_rows(w, n0, N), 0, 1);
    Tensor x = randn({M, K}, DType::kBF16, seed + 1);
    Tensor xg = to_gpu(x);
    Tensor y = poisoned_gpu({M, N}, DType::kFP32);
    auto run = [&] { ASSERT_TRUE(cuda::nvfp4_gemm_domains(xg, {d0, d1}, {}, y, false, slices(n0, N), caller_)); };
    run();  // eager: scratch and the SM table are created outside the capture
    ASSERT_EQ(cudaStreamSynchronize(caller_), cudaSuccess);
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w), N)), fp32_out_gemm_tolerance(K));
    cuda::Graph graph;
    graph.begin_capture(caller_);
    run();
    graph.end_capture();
    for (int rep = 0; rep < 3; ++rep) {  // counters reset themselves between replays
      y.fill_nan_();
      graph.replay(caller_);
      EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w), N)), fp32_out_gemm_tolerance(K)) << "replay " << rep;
    }
    // In-place reload of both shards (global scales included): the graph sees the new weights.
    ops::Nvfp4Weight w2 = random_nvfp4(N, K, seed + 9);
    w2.global_scale = w.global_scale * 3.f;
    cuda::nvfp4_prepare_into(ops::nvfp4_rows(w2, 0, n0), d0);
    cuda::nvfp4_prepare_into(ops::nvfp4_rows(w2, n0, N), d1);
    y.fill_nan_();
    graph.replay(caller_);
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w2), N)), fp32_out_gemm_tolerance(K));
  }
}

TEST_F(CudaStreamDomains, Nvfp4SwigluShardsInOneLaunch) {
  const uint64_t seed = fresh_seed();
  const int64_t M = 12, I = 256, K = 1024, i0 = 128;
  ops::Nvfp4Weight s0 = random_nvfp4(2 * i0, K, seed), s1 = random_nvfp4(2 * (I - i0), K, seed + 1);
  s1.global_scale = s0.global_scale;
  Tensor x = randn({M, K}, DType::kBF16, seed + 2);
  Tensor y = poisoned_gpu({M, I}, DType::kBF16);
  ASSERT_TRUE(cuda::nvfp4_gemm_domains(to_gpu(x), {cuda::nvfp4_prepare(s0, 0, 0), cuda::nvfp4_prepare(s1, 0, 1)}, {}, y,
                                       true, slices(i0, I), caller_));
  EXPECT_LT(rel_error(fetch(y), ref_swiglu_two_shards(x, s0, s1, i0, I)), bf16_gemm_tolerance(K));
}

// The MLA absorbed products: activations and outputs are [T, H, D] buffers viewed as [H, T, D].
TEST_F(CudaStreamDomains, BatchedOverHeadsWithStridedViews) {
  const uint64_t seed = fresh_seed();
  for (auto [H, T, K, N, h0] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{16, 1, 128, 512, 8},
                                {128, 4, 512, 128, 64}, {6, 13, 64, 40, 2}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " H " << H << " T " << T << " K " << K << " N " << N);
    Tensor act = randn({T, H, K + 64}, DType::kBF16, seed + H);  // [T, H, K | 64 more] as MLA's q
    Tensor a = act.slice(2, 0, K).transpose(0, 1);                  // [H, T, K] view
    Tensor w = randn({H, N, K}, DType::kBF16, seed + H + 1, 0.05);  // per-head [N, K]
    const std::vector<double> ref = ref_bmm_nk(a.clone(), w);
    Tensor ag = to_gpu(act).slice(2, 0, K).transpose(0, 1);
    // Unpartitioned: ops contract b = [H, K, N] as a transposed view of w.
    Tensor out = poisoned_gpu({T, H, N}, DType::kBF16);
    cuda::bmm(ag, to_gpu(w).transpose(1, 2), out.transpose(0, 1), caller_);
    EXPECT_LT(rel_error(fetch(out).transpose(0, 1).clone(), ref), bf16_gemm_tolerance(K));
    // Partitioned over heads: one launch.
    Tensor w0 = w.slice(0, 0, h0).to(Device::cuda(0), 0), w1 = w.slice(0, h0, H).to(Device::cuda(0), 1);
    Tensor out2 = poisoned_gpu({T, H, N}, DType::kFP32);
    ASSERT_TRUE(cuda::bmm_domains(ag, {w0.transpose(1, 2), w1.transpose(1, 2)}, out2.transpose(0, 1),
                                  {{0, h0, parts_[0].stream}, {h0, H, parts_[1].stream}}, caller_));
    EXPECT_LT(rel_error(fetch(out2).transpose(0, 1).clone(), ref), fp32_out_gemm_tolerance(K));
  }
}

// Correctness never depends on where CTAs land: with every SM mapped to domain 0, domain 1's work
// is done entirely by stealing; with no table at all, likewise.
TEST(CudaStreamGemm, DomainWithoutSmsIsStolen) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  const int64_t M = 8, N = 320, K = 1024, n0 = 160;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  Tensor w = randn({N, K}, DType::kBF16, seed + 1, 0.05);
  Tensor xg = to_gpu(x), s0 = to_gpu(w.slice(0, 0, n0).clone()), s1 = to_gpu(w.slice(0, n0, N).clone());
  Tensor table = Tensor::zeros({1024}, DType::kU8, Device::cuda(0));
  for (bool with_table : {true, false}) {
    Tensor y = poisoned_gpu({M, N}, DType::kBF16);
    cuda::detail::StreamGemmArgs a =
        two_domain_args(cuda::detail::StreamWeight::kBF16, xg, y, n0, with_table ? table.data<uint8_t>() : nullptr);
    for (int p = 0; p < 2; ++p) {
      a.parts[p].w = (p ? s1 : s0).data_ptr();
      a.parts[p].ldw = K;
    }
    cuda::detail::launch_stream_gemm(a, nullptr);
    EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w)), bf16_gemm_tolerance(K)) << "with_table " << with_table;
  }
}

}  // namespace
}  // namespace locus
