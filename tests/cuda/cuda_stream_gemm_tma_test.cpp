// The NVFP4 streaming GEMM's TMA feed (StreamGemmTuning::feed = 1, stream_gemm_tma_kernel.cu):
// against fp64 with poisoned outputs under every work decomposition and ring depth (and with an
// L2 prefetch), plain, fused
// SwiGLU (up rows on and off a storage-group boundary), bias, bf16 and fp32 outputs, K tails and
// partial row groups; bitwise repeatable; captured in a graph and replayed after an in-place
// reload; domain-aware launches over two partitions (work stolen from a domain without SMs); and
// the problems it declines run the cp.async kernel. Chained (programmatic dependent)
// launches and the traced form are in cuda_stream_gemm_test.cpp.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "backends/cuda/stream_gemm.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;
namespace cd = cuda::detail;

// Sets the TMA feed (with the given units per CTA, ring depth, KB asked of L2 early and consumer
// warps) for the test's scope.
struct TmaFeed {
  explicit TmaFeed(int units = 0, int stages = 0, int prefetch_kb = 0, int warps = 0) {
    cd::StreamGemmTuning t;
    t.units_per_cta = units;
    t.warps = warps;
    t.stages = stages;
    t.prefetch_kb = prefetch_kb;
    t.feed = 1;
    cd::set_stream_gemm_tuning(t);
  }
  ~TmaFeed() { cd::set_stream_gemm_tuning({}); }
};

// Runs `launch` and says whether it went through the TMA feed (exactly one launch of it, none of
// the cp.async kernel).
template <class F>
bool ran_tma(F&& launch) {
  const uint64_t tma = cd::stream_gemm_feed_launches(1), rings = cd::stream_gemm_feed_launches(0);
  launch();
  return cd::stream_gemm_feed_launches(1) == tma + 1 && cd::stream_gemm_feed_launches(0) == rings;
}

// The knobs are checked when set (no GPU needed): 16 warps are the TMA feed's consumer warps only,
// 4 the cp.async rings' only, and ring depths follow the feed.
TEST(CudaStreamGemmTmaTuning, WarpsAndStagesFollowTheFeed) {
  auto tuning = [](int feed, int warps, int stages) {
    cd::StreamGemmTuning t;
    t.feed = feed;
    t.warps = warps;
    t.stages = stages;
    return t;
  };
  EXPECT_NO_THROW(cd::set_stream_gemm_tuning(tuning(1, 16, 6)));
  EXPECT_NO_THROW(cd::set_stream_gemm_tuning(tuning(1, 8, 0)));
  EXPECT_NO_THROW(cd::set_stream_gemm_tuning(tuning(0, 4, 4)));
  EXPECT_THROW(cd::set_stream_gemm_tuning(tuning(0, 16, 0)), Error);
  EXPECT_THROW(cd::set_stream_gemm_tuning(tuning(1, 4, 0)), Error);
  EXPECT_THROW(cd::set_stream_gemm_tuning(tuning(0, 8, 6)), Error);
  EXPECT_THROW(cd::set_stream_gemm_tuning(tuning(2, 0, 0)), Error);
  cd::set_stream_gemm_tuning({});
}

TEST(CudaStreamGemmTma, MatchesFp64UnderEveryDecomposition) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  const uint64_t seed = fresh_seed();
  // 200 rows: a partial last row group; 416 = 2 x 208: SwiGLU up rows start inside a storage
  // group; K = 1552 and 192: a K tail and rows of 3 chunks; 32768 x 1024: 512 rows, so that with
  // whole rows as units (units -1) a CTA takes several, handed over one ahead.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4096, 7168}, {5, 200, 192}, {9, 416, 1552},
                         {16, 1024, 1536}, {12, 2048, 3072}, {1, 32768, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " N " << n << " K " << k);
    Tensor x = randn({m, k}, DType::kBF16, seed + n);
    const ops::Nvfp4Weight host = random_nvfp4(n, k, seed + n + 1);
    Tensor bias = randn({n}, DType::kBF16, seed + n + 2);
    const ops::Nvfp4Weight w = cuda::nvfp4_prepare(host, 0, -1);
    const Tensor xg = to_gpu(x), bg = to_gpu(bias);
    const std::vector<double> dq = dequant_ref(host);
    const std::vector<double> ref = ref_gemm_dense(x, dq, n, Tensor()), ref_bias = ref_gemm_dense(x, dq, n, bias);
    const std::vector<double> ref_gated = ref_swiglu(ref, m, n / 2);
    // The last three: 16 consumer warps (one CTA per SM).
    for (auto [units, stages, prefetch_kb, warps] :
         {std::tuple{0, 0, 0, 0}, {-1, 0, 0, 0}, {1, 0, 0, 0}, {2, 0, 0, 0}, {5, 0, 0, 0}, {0, 2, 0, 0}, {1, 4, 0, 0},
          {0, 0, 512, 0}, {0, 0, 0, 16}, {-1, 0, 0, 16}, {2, 2, 0, 16}}) {
      SCOPED_TRACE(::testing::Message() << "units per CTA " << units << ", stages " << stages << ", prefetch "
                                        << prefetch_kb << " KB, warps " << warps);
      TmaFeed feed(units, stages, prefetch_kb, warps);
      Tensor y = poisoned_gpu({m, n}, DType::kFP32);
      EXPECT_TRUE(ran_tma([&] { cuda::nvfp4_gemm(xg, w, {}, y, nullptr); }));
      EXPECT_LT(rel_error(fetch(y), ref), fp32_out_gemm_tolerance(k));
      Tensor yb = poisoned_gpu({m, n}, DType::kBF16);
      EXPECT_TRUE(ran_tma([&] { cuda::nvfp4_gemm(xg, w, bg, yb, nullptr); }));
      EXPECT_LT(rel_error(fetch(yb), ref_bias), bf16_gemm_tolerance(k));
      if ((n / 2) % 16 == 0) {  // the fused form needs the up rows on a 16-row tile
        Tensor ys = poisoned_gpu({m, n / 2}, DType::kBF16);
        EXPECT_TRUE(ran_tma([&] { cuda::nvfp4_gemm_swiglu(xg, w, ys, nullptr); }));
        EXPECT_LT(rel_error(fetch(ys), ref_gated), bf16_gemm_tolerance(k));
      }
    }
  }
}

// Same inputs, same bits: five eager runs, then a captured graph's replays; a replay after an
// in-place reload (global scale included) computes with the new weights.
TEST(CudaStreamGemmTma, RepeatableCapturedAndReloadedInPlace) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  TmaFeed feed;
  const int64_t M = 3, N = 7168, K = 2048;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  const ops::Nvfp4Weight host = random_nvfp4(N, K, seed + 1);
  const ops::Nvfp4Weight w = cuda::nvfp4_prepare(host, 0, -1);
  const Tensor xg = to_gpu(x);
  Tensor first = poisoned_gpu({M, N}, DType::kFP32), y = poisoned_gpu({M, N}, DType::kFP32);
  ASSERT_TRUE(ran_tma([&] { cuda::nvfp4_gemm(xg, w, {}, first, nullptr); }));
  const Tensor expected = fetch(first);
  EXPECT_LT(rel_error(expected, ref_gemm_dense(x, dequant_ref(host), N, Tensor())), fp32_out_gemm_tolerance(K));
  for (int i = 0; i < 5; ++i) {
    y.fill_nan_();
    cuda::nvfp4_gemm(xg, w, {}, y, nullptr);
    EXPECT_TRUE(bitwise_equal(fetch(y), expected)) << "run " << i;
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cuda::nvfp4_gemm(xg, w, {}, y, stream);  // eager first: the stream's scratch is made outside the capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cuda::Graph graph;
  graph.begin_capture(stream);
  for (int i = 0; i < 3; ++i) cuda::nvfp4_gemm(xg, w, {}, y, stream);  // back to back: dependent launches
  graph.end_capture();
  for (int rep = 0; rep < 2; ++rep) {
    y.fill_nan_();
    graph.replay(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(bitwise_equal(fetch(y), expected)) << "replay " << rep;
  }
  ops::Nvfp4Weight host2 = random_nvfp4(N, K, seed + 2);
  host2.global_scale = host.global_scale * 3.f;
  cuda::nvfp4_prepare_into(host2, w);
  y.fill_nan_();
  graph.replay(stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(host2), N, Tensor())), fp32_out_gemm_tolerance(K));
  cudaStreamDestroy(stream);
}

// BF16 weights and M > 16 are not the TMA feed's: they run the cp.async kernel, correctly, also
// under the TMA feed's ring depth and consumer warps.
TEST(CudaStreamGemmTma, DeclinedProblemsRunTheRingKernel) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t K = 1024, N = 512;
  // A TMA ring depth and consumer warp count: the cp.async kernel must not take them for its own.
  for (const auto [M, warps] : {std::pair<int64_t, int>{4, 0}, {24, 0}, {4, 16}, {24, 16}}) {
    SCOPED_TRACE(::testing::Message() << "M " << M << ", warps " << warps);
    TmaFeed feed(0, warps == 16 ? 4 : 6, 0, warps);  // 16 consumer warps have room for 4 stages
    Tensor x = randn({M, K}, DType::kBF16, seed + M);
    const Tensor xg = to_gpu(x);
    Tensor w = randn({N, K}, DType::kBF16, seed + M + 1, 0.05);
    Tensor y = poisoned_gpu({M, N}, DType::kFP32);
    const uint64_t tma = cd::stream_gemm_feed_launches(1);
    ASSERT_TRUE(cuda::stream_gemm(xg, to_gpu(w), {}, y, false, nullptr));
    EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w)), fp32_out_gemm_tolerance(K));
    const ops::Nvfp4Weight host = random_nvfp4(N, K, seed + M + 2);
    y = poisoned_gpu({M, N}, DType::kFP32);
    cuda::nvfp4_gemm(xg, cuda::nvfp4_prepare(host, 0, -1), {}, y, nullptr);
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(host), N, Tensor())), fp32_out_gemm_tolerance(K));
    EXPECT_EQ(cd::stream_gemm_feed_launches(1), tma + (M <= 16 ? 1 : 0)) << "M " << M;
  }
}

// Activations with a row stride wider than K (a column slice of a wider tensor, as the tensor
// map's row stride must follow), at M = 1, 5 and 16; K = 96 (too short for a two-chunk stage's
// activation box: stages of one chunk); and K < 64 (narrower than one activation box), which the
// cp.async kernel takes.
TEST(CudaStreamGemmTma, StridedActivationsAndShortK) {
  LOCUS_REQUIRE_GPU();
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);  // the ops at decode M: this kernel alone
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  TmaFeed feed;
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 512, 1552}, {5, 512, 1552}, {16, 256, 2048},
                         {5, 512, 96}, {4, 512, 32}, {16, 256, 48}}) {
    SCOPED_TRACE(::testing::Message() << "M " << m << " N " << n << " K " << k);
    const Tensor wide = randn({m, k + 72}, DType::kBF16, seed + m + k);  // row stride k + 72: 16-byte rows
    const Tensor x = wide.slice(1, 8, 8 + k).clone();
    const Tensor xg = to_gpu(wide).slice(1, 8, 8 + k);
    ASSERT_EQ(xg.stride(0), k + 72);
    const ops::Nvfp4Weight host = random_nvfp4(n, k, seed + m + k + 1);
    const ops::Nvfp4Weight w = cuda::nvfp4_prepare(host, 0, -1);
    Tensor y = poisoned_gpu({m, n}, DType::kFP32);
    const uint64_t tma = cd::stream_gemm_feed_launches(1);
    cuda::nvfp4_gemm(xg, w, {}, y, nullptr);
    EXPECT_EQ(cd::stream_gemm_feed_launches(1), tma + (k >= 64 ? 1 : 0));
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(host), n, Tensor())), fp32_out_gemm_tolerance(k));
  }
}

// Domain-aware launches (two green-context partitions, one NVFP4 shard each) on the TMA feed:
// plain with bias and fused SwiGLU, eager and captured, replayed after an in-place reload.
class CudaStreamGemmTmaDomains : public CudaTwoDomains {};

TEST_F(CudaStreamGemmTmaDomains, ShardsInOneLaunchMatchAndReplay) {
  const uint64_t seed = fresh_seed();
  TmaFeed feed;
  for (auto [M, N, K, n0] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 4096, 7168, 2048}, {5, 3072, 2048, 1024},
                             {16, 1024, 1536, 384}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << M << " N " << N << " K " << K);
    const ops::Nvfp4Weight host = random_nvfp4(N, K, seed + M);
    ops::Nvfp4Weight d0 = cuda::nvfp4_prepare(ops::nvfp4_rows(host, 0, n0), 0, 0);
    ops::Nvfp4Weight d1 = cuda::nvfp4_prepare(ops::nvfp4_rows(host, n0, N), 0, 1);
    Tensor x = randn({M, K}, DType::kBF16, seed + M + 1);
    Tensor bias = randn({N}, DType::kFP32, seed + M + 2);
    const Tensor xg = to_gpu(x), bg = to_gpu(bias);
    const std::vector<cuda::DomainSlice> sl = {{0, n0, parts_[0].stream}, {n0, N, parts_[1].stream}};
    Tensor y = poisoned_gpu({M, N}, DType::kFP32);
    auto run = [&] { ASSERT_TRUE(cuda::nvfp4_gemm_domains(xg, {d0, d1}, bg, y, false, sl, caller_)); };
    ASSERT_TRUE(ran_tma(run));  // eager first: scratch and the SM table are made outside the capture
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(host), N, bias)), fp32_out_gemm_tolerance(K));
    cuda::Graph graph;
    graph.begin_capture(caller_);
    run();
    run();  // back to back: the second overlaps the first
    graph.end_capture();
    ops::Nvfp4Weight host2 = random_nvfp4(N, K, seed + M + 3);
    host2.global_scale = host.global_scale * 0.5f;
    cuda::nvfp4_prepare_into(ops::nvfp4_rows(host2, 0, n0), d0);
    cuda::nvfp4_prepare_into(ops::nvfp4_rows(host2, n0, N), d1);
    y.fill_nan_();
    graph.replay(caller_);
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(host2), N, bias)), fp32_out_gemm_tolerance(K));
    // Fused SwiGLU: each shard holds its gate rows, then the matching up rows.
    const int64_t I = N / 2, i0 = n0 / 2;
    ops::Nvfp4Weight g0 = random_nvfp4(2 * i0, K, seed + M + 4), g1 = random_nvfp4(2 * (I - i0), K, seed + M + 5);
    g1.global_scale = g0.global_scale;
    Tensor ys = poisoned_gpu({M, I}, DType::kBF16);
    ASSERT_TRUE(ran_tma([&] {
      ASSERT_TRUE(cuda::nvfp4_gemm_domains(xg, {cuda::nvfp4_prepare(g0, 0, 0), cuda::nvfp4_prepare(g1, 0, 1)}, {}, ys,
                                           true, {{0, i0, parts_[0].stream}, {i0, I, parts_[1].stream}}, caller_));
    }));
    EXPECT_LT(rel_error(fetch(ys), ref_swiglu_two_shards(x, g0, g1, i0, I)), bf16_gemm_tolerance(K));
  }
}

// Correctness never depends on where CTAs land: with every SM mapped to domain 0 (the table) or
// no table at all, domain 1's units are all stolen.
TEST(CudaStreamGemmTma, DomainWithoutSmsIsStolen) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  TmaFeed feed;
  const int64_t M = 4, N = 1024, K = 3072, n0 = 512;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  const ops::Nvfp4Weight host = random_nvfp4(N, K, seed + 1);
  const ops::Nvfp4Weight s0 = cuda::nvfp4_prepare(ops::nvfp4_rows(host, 0, n0), 0, -1);
  const ops::Nvfp4Weight s1 = cuda::nvfp4_prepare(ops::nvfp4_rows(host, n0, N), 0, -1);
  const Tensor xg = to_gpu(x);
  Tensor table = Tensor::zeros({1024}, DType::kU8, Device::cuda(0));
  for (bool with_table : {true, false}) {
    Tensor y = poisoned_gpu({M, N}, DType::kFP32);
    cd::StreamGemmArgs a =
        two_domain_args(cd::StreamWeight::kNVFP4, xg, y, n0, with_table ? table.data<uint8_t>() : nullptr);
    for (int p = 0; p < 2; ++p) {
      const ops::Nvfp4Weight& w = p ? s1 : s0;
      a.parts[p].w = w.packed.data_ptr();
      a.parts[p].scales = w.scales.data<uint16_t>();
      a.parts[p].global_scale = cuda::nvfp4_global_scale_device(w);
    }
    EXPECT_TRUE(ran_tma([&] { cd::launch_stream_gemm(a, nullptr); })) << "with_table " << with_table;
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(host), N, Tensor())), fp32_out_gemm_tolerance(K))
        << "with_table " << with_table;
  }
}

}  // namespace
}  // namespace locus
