// The NVFP4 decode-batch kernel on wgmma (backends/cuda/nvfp4_wgmma.h) against fp64 references:
// every M up to 64 (both token tiles), N and K off the 64-row / 64-K grid, bias, fp32 and bf16
// outputs, fused SwiGLU, shapes whose stream-K units end inside blocks (partials), determinism.
// Its domain-aware form (two green-context partitions, a CUDA graph, an in-place reload) is in
// cuda_stream_gemm_test.cpp (Nvfp4ShardsInOneLaunchCaptureAndReload, M = 56). Outputs are
// NaN-poisoned before every run.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "backends/cuda/nvfp4_wgmma.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

// Routes every NVFP4 GEMM with M <= 64 to the wgmma kernel while a test runs (then the default
// rule again).
struct ForceWgmma {
  ForceWgmma() { cuda::detail::set_nvfp4_wgmma_min_m(1); }
  ~ForceWgmma() { cuda::detail::set_nvfp4_wgmma_min_m(0); }
};

// The kernel's arguments for a whole prepared weight (one part, domain 0).
cuda::detail::StreamGemmArgs whole_weight_args(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& y) {
  cuda::detail::StreamGemmArgs a;
  a.format = cuda::detail::StreamWeight::kNVFP4;
  a.x = x.data<uint16_t>();
  a.x_ld = x.stride(0);
  a.m = static_cast<int32_t>(x.size(0));
  a.k = w.k;
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.y_f32 = y.dtype() == DType::kFP32;
  a.num_parts = 1;
  a.parts[0].w = w.packed.data_ptr();
  a.parts[0].scales = w.scales.data<uint16_t>();
  a.parts[0].global_scale = cuda::nvfp4_global_scale_device(w);
  a.parts[0].rows = static_cast<int32_t>(w.n);
  return a;
}

TEST(CudaNvfp4Wgmma, EveryMMatchesFp64) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  // 4096 x 7168: 16 blocks of 112 chunks over 132+ CTAs, so units end inside blocks.
  for (auto [n, k] : {std::pair<int64_t, int64_t>{200, 192}, {64, 64}, {1000, 2080}, {4096, 7168}}) {
    ops::Nvfp4Weight w = random_nvfp4(n, k, seed + n);
    const ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w, 0, -1);
    const std::vector<double> wd = dequant_ref(w);
    for (int64_t m : {1, 7, 17, 32, 33, 64}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " N " << n << " K " << k);
      Tensor x = randn({m, k}, DType::kBF16, seed + m);
      const Tensor xg = to_gpu(x);
      Tensor y = poisoned_gpu({m, n}, DType::kFP32);
      cuda::detail::StreamGemmArgs a = whole_weight_args(xg, wg, y);
      ASSERT_TRUE(cuda::detail::nvfp4_wgmma_eligible(a));
      cuda::detail::launch_nvfp4_wgmma(a, nullptr);
      EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, wd, n, Tensor())), fp32_out_gemm_tolerance(k));
    }
  }
}

TEST(CudaNvfp4Wgmma, BiasAndBf16OutputThroughTheOp) {
  LOCUS_REQUIRE_GPU();
  ForceWgmma force;
  const uint64_t seed = fresh_seed();
  for (auto [m, n, k, bias_f32] : {std::tuple<int64_t, int64_t, int64_t, bool>{24, 7168, 2048, false}, {64, 72, 208, true},
                                   {40, 1536, 512, true}, {5, 300, 1024, false}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " N " << n << " K " << k);
    ops::Nvfp4Weight w = random_nvfp4(n, k, seed + n);
    Tensor x = randn({m, k}, DType::kBF16, seed + 1);
    Tensor bias = randn({n}, bias_f32 ? DType::kFP32 : DType::kBF16, seed + 2);
    Tensor y = poisoned_gpu({m, n}, DType::kBF16);
    cuda::nvfp4_gemm(to_gpu(x), cuda::nvfp4_prepare(w, 0, -1), to_gpu(bias), y, nullptr);
    EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w), n, bias)), bf16_gemm_tolerance(k));
  }
}

TEST(CudaNvfp4Wgmma, FusedSwiglu) {
  LOCUS_REQUIRE_GPU();
  ForceWgmma force;
  const uint64_t seed = fresh_seed();
  // I = 16: one tile of gate rows, the up rows' group reads past the weight's end (clamped).
  for (auto [m, inter, k] : {std::tuple<int64_t, int64_t, int64_t>{20, 16, 96}, {40, 96, 512}, {64, 2048, 7168}, {9, 256, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " I " << inter << " K " << k);
    ops::Nvfp4Weight w = random_nvfp4(2 * inter, k, seed + inter);
    Tensor x = randn({m, k}, DType::kBF16, seed + 1);
    Tensor y = poisoned_gpu({m, inter}, DType::kBF16);
    cuda::nvfp4_gemm_swiglu(to_gpu(x), cuda::nvfp4_prepare(w, 0, -1), y, nullptr);
    const auto ref = ref_swiglu(ref_gemm_dense(x, dequant_ref(w), 2 * inter), m, inter);
    EXPECT_LT(rel_error(fetch(y), ref), bf16_gemm_tolerance(k));
  }
}

TEST(CudaNvfp4Wgmma, RepeatedRunsAreBitIdentical) {
  LOCUS_REQUIRE_GPU();
  ForceWgmma force;
  const uint64_t seed = fresh_seed();
  const int64_t m = 48, n = 4096, k = 7168;
  const ops::Nvfp4Weight wg = cuda::nvfp4_prepare(random_nvfp4(n, k, seed), 0, -1);
  const Tensor x = to_gpu(randn({m, k}, DType::kBF16, seed + 1));
  Tensor first = poisoned_gpu({m, n}, DType::kFP32);
  cuda::nvfp4_gemm(x, wg, {}, first, nullptr);
  for (int rep = 0; rep < 3; ++rep) {
    Tensor again = poisoned_gpu({m, n}, DType::kFP32);
    cuda::nvfp4_gemm(x, wg, {}, again, nullptr);
    EXPECT_TRUE(bitwise_equal(fetch(again), fetch(first))) << "rep " << rep;
  }
}

}  // namespace
}  // namespace locus
