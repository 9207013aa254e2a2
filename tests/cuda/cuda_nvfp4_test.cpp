// NVFP4 weight-only GEMM (our kernel) against an fp64 dequantized reference.
#include <gtest/gtest.h>

#include "backends/cuda/stream_gemm.h"
#include "cuda_test_util.h"
#include "ops/nvfp4_row_blocks.h"

namespace locus {
namespace {

using namespace locus::testing;

struct Fp4Case {
  int64_t m, n, k;
  DType out;
  int bias;
};

class CudaNvfp4 : public ::testing::TestWithParam<Fp4Case> {};

TEST_P(CudaNvfp4, MatchesDequantizedReference) {
  LOCUS_REQUIRE_GPU();
  const Fp4Case c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << c.m << " N " << c.n << " K " << c.k);
  ops::Nvfp4Weight w = random_nvfp4(c.n, c.k, seed);
  Tensor x = randn({c.m, c.k}, DType::kBF16, seed + 1);
  Tensor bias;
  if (c.bias) bias = randn({c.n}, c.bias == 1 ? DType::kBF16 : DType::kFP32, seed + 2);
  ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w, 0, -1);
  EXPECT_EQ(wg.layout, ops::Nvfp4Layout::kCudaTiled);
  Tensor y = poisoned_gpu({c.m, c.n}, c.out);
  cuda::nvfp4_gemm(to_gpu(x), wg, bias.defined() ? to_gpu(bias) : Tensor(), y, nullptr);
  const double tol = c.out == DType::kBF16 ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k);
  EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w), c.n, bias)), tol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaNvfp4,
                         ::testing::Values(Fp4Case{1, 64, 64, DType::kBF16, 0}, Fp4Case{1, 40, 80, DType::kFP32, 0},
                                           Fp4Case{5, 100, 1024, DType::kBF16, 1},
                                           Fp4Case{8, 256, 512, DType::kFP32, 2},
                                           Fp4Case{13, 48, 2048, DType::kFP32, 0},
                                           Fp4Case{16, 512, 4096, DType::kBF16, 0},
                                           Fp4Case{40, 72, 208, DType::kFP32, 1},
                                           Fp4Case{97, 160, 320, DType::kBF16, 0}));

TEST(CudaNvfp4Swiglu, FusedAndUnfusedTilings) {
  LOCUS_REQUIRE_GPU();
  // I = 64 takes the fused kernel (gate and up on 16-row tiles); I = 40 the fallback.
  for (auto [m, inter, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 256}, {11, 64, 512}, {3, 40, 128}, {20, 32, 96}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " I " << inter);
    ops::Nvfp4Weight w = random_nvfp4(2 * inter, k, seed);
    Tensor x = randn({m, k}, DType::kBF16, seed + 1);
    ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w, 0, -1);
    Tensor y = poisoned_gpu({m, inter}, DType::kBF16);
    cuda::nvfp4_gemm_swiglu(to_gpu(x), wg, y, nullptr);
    auto ref = ref_swiglu(ref_gemm_dense(x, dequant_ref(w), 2 * inter), m, inter);
    EXPECT_LT(rel_error(fetch(y), ref), bf16_gemm_tolerance(k));
  }
}

TEST(CudaNvfp4, OutputSliceAndInPlaceReload) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  const int64_t M = 3, N = 96, K = 192, wide = 160, col0 = 32;
  ops::Nvfp4Weight w = random_nvfp4(N, K, seed);
  Tensor x = randn({M, K}, DType::kBF16, seed + 1);
  Tensor xg = to_gpu(x);
  ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w, 0, 0);
  EXPECT_EQ(wg.packed.domain(), 0);
  Tensor y = poisoned_gpu({M, wide}, DType::kFP32);
  Tensor slice = y.slice(1, col0, col0 + N);
  cuda::nvfp4_gemm(xg, wg, {}, slice, nullptr);
  Tensor out = fetch(y);
  EXPECT_LT(rel_error(out.slice(1, col0, col0 + N), ref_gemm_dense(x, dequant_ref(w), N)), fp32_out_gemm_tolerance(K));
  EXPECT_TRUE(std::isnan(get(out, 0))) << "columns outside the slice must stay untouched";
  // Reload new values into the same buffers.
  void* before = wg.packed.data_ptr();
  ops::Nvfp4Weight w2 = random_nvfp4(N, K, seed + 7);
  cuda::nvfp4_prepare_into(w2, wg);
  EXPECT_EQ(wg.packed.data_ptr(), before);
  slice.fill_nan_();
  cuda::nvfp4_gemm(xg, wg, {}, slice, nullptr);
  EXPECT_LT(rel_error(fetch(slice), ref_gemm_dense(x, dequant_ref(w2), N)), fp32_out_gemm_tolerance(K));
}

// Row blocks of `counts` rows of a [R, K] x, each with its own [N, K] weight (with swiglu
// [2N, K]), from row 1 on (row 0 is in no block): each block's rows against fp64, the row outside
// every block still poisoned, and the streaming launches counted, shared and one per block.
void check_row_blocks(int64_t K, int64_t N, const std::vector<int64_t>& counts, uint64_t shared_launches,
                      uint64_t each_launches) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " K " << K);
  const bool was = cuda::nvfp4_row_block_launches();
  // The launches counted are the streaming kernel's (at decode M the ops could take the
  // matrix-vector kernel, cuda_nvfp4_gemv_test.cpp).
  const ScopedNvfp4Path streaming(Nvfp4Path::kStreaming);
  for (const bool swiglu : {false, true}) {
    SCOPED_TRACE(swiglu ? "swiglu" : "plain");
    std::vector<ops::Nvfp4Weight> host, dev;
    std::vector<ops::Nvfp4RowBlock> blocks;
    int64_t row = 1;
    for (size_t b = 0; b < counts.size(); ++b) {
      host.push_back(random_nvfp4(swiglu ? 2 * N : N, K, seed + 10 + b));
      dev.push_back(cuda::nvfp4_prepare(host.back(), 0, -1));
      blocks.push_back({nullptr, row, counts[b]});
      row += counts[b];
    }
    for (size_t b = 0; b < counts.size(); ++b) blocks[b].w = &dev[b];
    const int64_t R = row;
    const Tensor x = randn({R, K}, DType::kBF16, seed + 1);
    const Tensor xg = to_gpu(x);
    for (const bool shared : {true, false}) {
      SCOPED_TRACE(shared ? "shared launches" : "one launch per block");
      cuda::set_nvfp4_row_block_launches(shared);
      // SwiGLU's outputs in bf16 (as the MoE writes them), the plain products in fp32.
      Tensor y = poisoned_gpu({R, N}, swiglu ? DType::kBF16 : DType::kFP32);
      const uint64_t before = cuda::detail::stream_gemm_feed_launches(0);
      ops::nvfp4_gemm_row_blocks(xg, blocks, y, swiglu);
      EXPECT_EQ(cuda::detail::stream_gemm_feed_launches(0) - before, shared ? shared_launches : each_launches);
      const Tensor out = fetch(y);
      for (int64_t c = 0; c < N; ++c) EXPECT_TRUE(std::isnan(get(out, c))) << "row 0 is in no block";
      for (size_t b = 0; b < counts.size(); ++b) {
        if (counts[b] == 0) continue;
        const int64_t r0 = blocks[b].row0, m = counts[b];
        std::vector<double> ref = ref_gemm_dense(x.slice(0, r0, r0 + m), dequant_ref(host[b]), swiglu ? 2 * N : N);
        if (swiglu) ref = ref_swiglu(ref, m, N);
        EXPECT_LT(rel_error(out.slice(0, r0, r0 + m), ref), swiglu ? bf16_gemm_tolerance(K) : fp32_out_gemm_tolerance(K))
            << "block " << b;
      }
    }
  }
  cuda::set_nvfp4_row_block_launches(was);
}

// Row blocks (a MoE's experts on their rows): with shared launches on, blocks of one row count
// run as parts of one streaming launch.
TEST(CudaNvfp4, RowBlocksShareLaunchesAndMatchFp64) {
  LOCUS_REQUIRE_GPU();
  // Nine blocks of 1 row (a launch of 8 parts, then one alone), two of 2 (one launch), one of 3
  // (alone) and an empty one: 4 launches, or 12.
  check_row_blocks(512, 128, {1, 1, 0, 2, 1, 3, 2, 1, 1, 1, 1, 1, 1}, 4, 12);
  // Blocks of 20 rows at K = 2048 (the streaming kernel's, not the wgmma kernel's): the two of 20
  // share a launch, 5 and 7 run alone: 3 launches, or 4.
  check_row_blocks(2048, 64, {20, 5, 20, 0, 7}, 3, 4);
}

// The modules' reload copies `packed` and `scales` of a freshly prepared weight into the old
// buffers; that must carry the (device-resident) global scale too.
TEST(CudaNvfp4, CopyingPreparedBuffersIsAFullReload) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  const int64_t M = 2, N = 48, K = 128;
  ops::Nvfp4Weight w = random_nvfp4(N, K, seed), w2 = random_nvfp4(N, K, seed + 1);
  w2.global_scale = w.global_scale * 3.f;
  Tensor x = randn({M, K}, DType::kBF16, seed + 2);
  Tensor xg = to_gpu(x);
  ops::Nvfp4Weight dst = cuda::nvfp4_prepare(w, 0, -1), fresh = cuda::nvfp4_prepare(w2, 0, -1);
  Tensor packed = dst.packed, scales = dst.scales;
  packed.copy_(fresh.packed);
  scales.copy_(fresh.scales);
  Tensor y = poisoned_gpu({M, N}, DType::kFP32);
  cuda::nvfp4_gemm(xg, dst, {}, y, nullptr);
  EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w2), N)), fp32_out_gemm_tolerance(K));
}

TEST(CudaNvfp4, BadInputsAreErrors) {
  LOCUS_REQUIRE_GPU();
  ops::Nvfp4Weight w = random_nvfp4(32, 64, 1);
  EXPECT_THROW(cuda::nvfp4_gemm(Tensor::zeros({2, 64}, DType::kBF16, Device::cuda(0)), w, {},
                                Tensor::zeros({2, 32}, DType::kBF16, Device::cuda(0)), nullptr),
               Error);  // not prepared
  ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w, 0, -1);
  Tensor buf = Tensor::zeros({2, 64}, DType::kBF16, Device::cuda(0));
  EXPECT_THROW(cuda::nvfp4_gemm(buf, wg, {}, buf.slice(1, 0, 32), nullptr), Error);  // in place over x
  EXPECT_THROW(cuda::nvfp4_gemm(Tensor::zeros({2, 48}, DType::kBF16, Device::cuda(0)), wg, {},
                                Tensor::zeros({2, 32}, DType::kBF16, Device::cuda(0)), nullptr),
               Error);  // K mismatch
  ops::Nvfp4Weight odd = random_nvfp4(8, 40, 2);
  odd.k = 40;
  EXPECT_THROW(cuda::nvfp4_prepare(odd, 0, -1), Error);  // K % 16 != 0
  ops::Nvfp4Weight nan_scale = random_nvfp4(16, 64, 3);
  nan_scale.scales.data<uint8_t>()[5] = 0x7F;
  EXPECT_THROW(cuda::nvfp4_prepare(nan_scale, 0, -1), Error);
}

}  // namespace
}  // namespace locus
