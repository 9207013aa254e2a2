// The BF16 decode matrix-vector kernel (bf16_gemv.h) against fp64 references on random inputs:
// every token count it takes, one and two rows a warp, each rows-per-CTA form, biases, a device
// alpha, fp32 and bf16 outputs written as a column slice of a poisoned tensor (the columns around
// it must stay poisoned), the same bits on a second call and from a graph replay; and cuda::gemm,
// which times it against cuBLASLt at decode M, from a graph.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/cuda_ops.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;
using cuda::detail::Bf16GemvArgs;

struct GemvCase {
  int64_t m, n, k;
  DType out;
  int bias;  // 0 none, 1 bf16, 2 fp32
  bool alpha;
};

// The output sits at columns [kLeft, kLeft + n) of a poisoned [m, n + kLeft + kRight] tensor.
constexpr int64_t kLeft = 3, kRight = 5;

class CudaBf16Gemv : public CudaCallerStream, public ::testing::WithParamInterface<GemvCase> {};

// Each kernel that takes the case (the CUDA-core one up to 4 tokens, the tensor-core one up to 8
// with K a multiple of 64), on the same fresh inputs.
TEST_P(CudaBf16Gemv, MatchesFp64ReferenceInItsColumnsOnlyAndRepeatsItsBits) {
  const GemvCase c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Tensor x = randn({c.m, c.k}, DType::kBF16, seed);
  const Tensor w = randn({c.n, c.k}, DType::kBF16, seed + 1, 0.05);
  Tensor bias;
  if (c.bias) bias = randn({c.n}, c.bias == 1 ? DType::kBF16 : DType::kFP32, seed + 2);
  const float alpha = c.alpha ? 0.75f : 1.f;
  Tensor alpha_host = Tensor::empty({1}, DType::kFP32);
  alpha_host.data<float>()[0] = alpha;
  const Tensor xg = to_gpu(x), wg = to_gpu(w), bg = bias.defined() ? to_gpu(bias) : Tensor();
  const Tensor alpha_g = to_gpu(alpha_host);
  const int64_t width = c.n + kLeft + kRight;
  Tensor y = poisoned_gpu({c.m, width}, c.out);

  Bf16GemvArgs a;
  a.x = xg.data_ptr();
  a.x_ld = c.k;
  a.w = wg.data_ptr();
  a.w_ld = c.k;
  a.bias = bg.defined() ? bg.data_ptr() : nullptr;
  a.bias_f32 = c.bias == 2;
  a.alpha = c.alpha ? alpha_g.data<float>() : nullptr;
  a.y = static_cast<char*>(y.data_ptr()) + kLeft * dtype_size(c.out);
  a.y_ld = width;
  a.y_f32 = c.out == DType::kFP32;
  a.m = c.m;
  a.n = c.n;
  a.k = c.k;

  std::vector<double> ref = ref_gemm(x, w);
  const std::vector<double> b = bias.defined() ? to_doubles(bias) : std::vector<double>(c.n, 0.0);
  for (int64_t t = 0; t < c.m; ++t)
    for (int64_t j = 0; j < c.n; ++j) ref[t * c.n + j] = alpha * ref[t * c.n + j] + b[j];
  const double tol = c.out == DType::kBF16 ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k);

  // The kernel with one row a warp, and with two where m >= 2.
  const auto cuda_cores = [](int row_pairs) {
    return [row_pairs](const Bf16GemvArgs& args, cudaStream_t s) {
      cuda::detail::set_bf16_gemv_row_pairs(row_pairs);
      cuda::detail::launch_bf16_gemv(args, s);
      cuda::detail::set_bf16_gemv_row_pairs(-1);
    };
  };
  struct Kernel {
    const char* name;
    bool takes;
    std::function<void(const Bf16GemvArgs&, cudaStream_t)> launch;
  };
  const bool fma = cuda::detail::bf16_gemv_eligible(a);
  const Kernel kernels[] = {{"a row a warp", fma, cuda_cores(0)}, {"two rows a warp", fma && c.m >= 2, cuda_cores(1)}};
  ASSERT_TRUE(fma);
  for (const Kernel& kernel : kernels) {
    if (!kernel.takes) continue;
    SCOPED_TRACE(::testing::Message() << kernel.name);
    expect_slice_and_repeats(y, kLeft, c.n, ref, tol, [&](cudaStream_t s) { kernel.launch(a, s); }, caller_);
  }
}

// Token counts 1-4; K from one vector a row (most warps of a row idle) to o_proj's 16384; row
// slots per CTA 1, 2, 4 and 8 on a 132-SM GPU (the last CTA's rows partly past N, and a slot's
// second row past N).
INSTANTIATE_TEST_SUITE_P(Shapes, CudaBf16Gemv,
                         ::testing::Values(GemvCase{1, 64, 128, DType::kBF16, 0, false},
                                           GemvCase{1, 7, 8, DType::kFP32, 1, false},
                                           GemvCase{2, 300, 1000, DType::kBF16, 2, true},
                                           GemvCase{3, 129, 2056, DType::kFP32, 0, true},
                                           GemvCase{4, 96, 7168, DType::kBF16, 1, false},
                                           GemvCase{1, 1100, 16384, DType::kBF16, 0, false},
                                           GemvCase{2, 1100, 4096, DType::kFP32, 1, true},
                                           GemvCase{2, 2200, 1024, DType::kFP32, 2, false},
                                           GemvCase{1, 4229, 512, DType::kBF16, 1, true},
                                           GemvCase{4, 4230, 256, DType::kBF16, 0, false},
                                           GemvCase{3, 17000, 1536, DType::kBF16, 1, false},
                                           GemvCase{2, 9001, 192, DType::kBF16, 0, true}));

TEST(CudaBf16GemvRules, SlotsPerCtaFillTheGpuAndKeepAFewLoadsALane) {
  EXPECT_EQ(cuda::detail::bf16_gemv_slots_per_cta(7168, 16384, 132), 1);   // o_proj: 8 vectors a lane
  EXPECT_EQ(cuda::detail::bf16_gemv_slots_per_cta(24576, 1536, 132), 8);   // q_b
  EXPECT_EQ(cuda::detail::bf16_gemv_slots_per_cta(1536, 7168, 132), 2);    // q_a
  EXPECT_EQ(cuda::detail::bf16_gemv_slots_per_cta(576, 7168, 132), 1);     // kv_a: too few slots for 2
  EXPECT_EQ(cuda::detail::bf16_gemv_slots_per_cta(32, 7168, 132), 1);      // a router's gate
  EXPECT_EQ(cuda::detail::bf16_gemv_slots_per_cta(2200, 1024, 132), 4);
  EXPECT_EQ(cuda::detail::bf16_gemv_slots_per_cta(1100, 4096, 132), 2);
}

TEST(CudaBf16GemvRules, TakesOnlyAlignedDecodeProblems) {
  Bf16GemvArgs a;
  alignas(16) static uint16_t buf[64];
  a.x = buf;
  a.w = buf;
  a.m = 1;
  a.n = 4;
  a.k = 16;
  a.x_ld = a.w_ld = 16;
  EXPECT_TRUE(cuda::detail::bf16_gemv_eligible(a));
  Bf16GemvArgs b = a;
  b.m = cuda::detail::kBf16GemvMaxM + 1;
  EXPECT_FALSE(cuda::detail::bf16_gemv_eligible(b));
  b = a;
  b.k = 12;  // not whole vectors
  EXPECT_FALSE(cuda::detail::bf16_gemv_eligible(b));
  b = a;
  b.w = buf + 1;  // rows not 16-byte aligned
  EXPECT_FALSE(cuda::detail::bf16_gemv_eligible(b));
  b = a;
  b.m = 2;
  b.x_ld = 20;
  EXPECT_FALSE(cuda::detail::bf16_gemv_eligible(b));
}

// cuda::gemm at decode M times the kernel against cuBLASLt once per shape (M = 8: cuBLASLt alone);
// whichever it takes, the result matches the reference, and a graph of the call replays its bits.
TEST_F(CudaCallerStream, GemmAtDecodeMatchesFp64AndReplaysFromAGraph) {
  for (const int64_t m : {1, 2, 4, 8}) {
    SCOPED_TRACE(m);
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const int64_t N = 1536, K = 2048;
    const Tensor x = randn({m, K}, DType::kBF16, seed);
    const Tensor w = randn({N, K}, DType::kBF16, seed + 1, 0.05);
    const Tensor xg = to_gpu(x), wg = to_gpu(w);
    Tensor y = poisoned_gpu({m, N}, DType::kBF16);
    cuda::gemm(xg, wg, {}, y, caller_);
    const Tensor eager = fetch(y);
    EXPECT_LT(rel_error(eager, ref_gemm(x, w)), bf16_gemm_tolerance(K));
    y.fill_nan_();
    cuda::Graph g;
    g.begin_capture(caller_);
    cuda::gemm(xg, wg, {}, y, caller_);
    g.end_capture();
    g.replay(caller_);
    EXPECT_TRUE(bitwise_equal(fetch(y), eager));
  }
}

}  // namespace
}  // namespace locus
