// BF16 GEMM / GEMM+SwiGLU / SwiGLU / BMM on CUDA against fp64 references on random inputs.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

struct GemmCase {
  int64_t m, n, k;
  DType out;
  int bias;  // 0 none, 1 bf16, 2 fp32
};

class CudaGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CudaGemm, MatchesFp64Reference) {
  LOCUS_REQUIRE_GPU();
  const GemmCase c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Tensor x = randn({c.m, c.k}, DType::kBF16, seed);
  Tensor w = randn({c.n, c.k}, DType::kBF16, seed + 1, 0.05);
  Tensor bias;
  if (c.bias) bias = randn({c.n}, c.bias == 1 ? DType::kBF16 : DType::kFP32, seed + 2);
  Tensor y = poisoned_gpu({c.m, c.n}, c.out);
  cuda::gemm(to_gpu(x), to_gpu(w), bias.defined() ? to_gpu(bias) : Tensor(), y, nullptr);
  const double tol = c.out == DType::kBF16 ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k);
  EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w, bias)), tol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemm,
                         ::testing::Values(GemmCase{1, 64, 128, DType::kBF16, 0}, GemmCase{3, 37, 72, DType::kBF16, 1},
                                           GemmCase{17, 96, 200, DType::kFP32, 0},
                                           GemmCase{33, 130, 64, DType::kFP32, 2},
                                           GemmCase{64, 256, 512, DType::kBF16, 2},
                                           GemmCase{5, 48, 96, DType::kFP32, 1}));

// Calls of one shape reuse their cached tactic and cuBLASLt descriptors: each call must still
// read its own operands and its own bias (the one pointer the descriptors hold). The operands of
// every call stay alive, so that no call gets an earlier call's addresses back; the biases are
// 256-byte-apart slices of one buffer (one alignment, so one cache entry).
TEST(CudaGemm, RepeatedShapeUsesEachCallsOperandsAndBias) {
  LOCUS_REQUIRE_GPU();
  const int64_t M = 4, N = 80, K = 96, kCalls = 3;
  for (const DType out : {DType::kBF16, DType::kFP32}) {
    const DType bias_dtype = out == DType::kBF16 ? DType::kBF16 : DType::kFP32;
    const int64_t stride = 256 / dtype_size(bias_dtype) * ((N * dtype_size(bias_dtype) + 255) / 256);
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const Tensor biases = randn({kCalls * stride}, bias_dtype, seed);
    const Tensor biases_gpu = to_gpu(biases);
    std::vector<Tensor> alive;
    for (int64_t call = 0; call < kCalls; ++call) {
      SCOPED_TRACE(call);
      Tensor x = randn({M, K}, DType::kBF16, seed + 10 * call + 1);
      Tensor w = randn({N, K}, DType::kBF16, seed + 10 * call + 2, 0.05);
      const Tensor bias = biases.slice(0, call * stride, call * stride + N);
      Tensor y = poisoned_gpu({M, N}, out);
      alive.insert(alive.end(), {to_gpu(x), to_gpu(w), y});
      cuda::gemm(alive[alive.size() - 3], alive[alive.size() - 2], biases_gpu.slice(0, call * stride, call * stride + N),
                 y, nullptr);
      const double tol = out == DType::kBF16 ? bf16_gemm_tolerance(K) : fp32_out_gemm_tolerance(K);
      EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w, bias)), tol);
    }
  }
}

TEST(CudaGemmSlices, ColumnSlicesWriteInPlaceWithFullLeadingDimension) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  const int64_t M = 7, N = 96, K = 136, split = 40;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  Tensor w = randn({N, K}, DType::kBF16, seed + 1, 0.05);
  Tensor xg = to_gpu(x), wg = to_gpu(w);
  Tensor y = poisoned_gpu({M, N}, DType::kBF16);
  cuda::gemm(xg, wg.slice(0, 0, split), {}, y.slice(1, 0, split), nullptr);
  cuda::gemm(xg, wg.slice(0, split, N), {}, y.slice(1, split, N), nullptr);
  EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w)), bf16_gemm_tolerance(K));
}

TEST(CudaGemmErrors, BadShapesNameTheOperand) {
  LOCUS_REQUIRE_GPU();
  Tensor x = Tensor::zeros({4, 32}, DType::kBF16, Device::cuda(0));
  Tensor w = Tensor::zeros({8, 16}, DType::kBF16, Device::cuda(0));
  Tensor y = Tensor::zeros({4, 8}, DType::kBF16, Device::cuda(0));
  try {
    cuda::gemm(x, w, {}, y, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disagree on K"), std::string::npos) << e.what();
  }
  Tensor xc = Tensor::zeros({4, 16}, DType::kBF16);
  EXPECT_THROW(cuda::gemm(xc, w, {}, y, nullptr), Error);  // host x
  Tensor y_bad = Tensor::zeros({4, 9}, DType::kBF16, Device::cuda(0));
  EXPECT_THROW(cuda::gemm(x.slice(1, 0, 16), w, {}, y_bad, nullptr), Error);
}

TEST(CudaSwiglu, FusedGemmSwigluMatchesReference) {
  LOCUS_REQUIRE_GPU();
  for (auto [m, inter, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 48, 64}, {9, 40, 200}, {31, 128, 96}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << " I " << inter);
    Tensor x = randn({m, k}, DType::kBF16, seed);
    Tensor w = randn({2 * inter, k}, DType::kBF16, seed + 1, 0.1);
    Tensor y = poisoned_gpu({m, inter}, DType::kBF16);
    cuda::gemm_swiglu(to_gpu(x), to_gpu(w), y, nullptr);
    EXPECT_LT(rel_error(fetch(y), ref_swiglu(ref_gemm(x, w), m, inter)), bf16_gemm_tolerance(k));
  }
}

TEST(CudaSwiglu, UnfusedKernelBf16AndFp32) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (DType in : {DType::kBF16, DType::kFP32}) {
    Tensor gu = randn({13, 2 * 50}, in, seed, 2.0);
    Tensor y = poisoned_gpu({13, 50}, DType::kFP32);
    cuda::swiglu(to_gpu(gu), y, nullptr);
    EXPECT_LT(rel_error(fetch(y), ref_swiglu(to_doubles(gu), 13, 50)), 1e-5);
  }
  EXPECT_THROW(cuda::swiglu(Tensor::zeros({2, 7}, DType::kBF16, Device::cuda(0)),
                            Tensor::zeros({2, 3}, DType::kBF16, Device::cuda(0)), nullptr),
               Error);
}

// y[b] = a[b] b[b], fp64.
std::vector<double> ref_bmm(const Tensor& a, const Tensor& b) {
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  Tensor ac = a.clone(), bc = b.clone();  // contiguous CPU copies (views resolved)
  std::vector<double> av = to_doubles(ac), bv = to_doubles(bc), out(static_cast<size_t>(B * M * N));
  for (int64_t h = 0; h < B; ++h)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[(h * M + m) * K + k] * bv[(h * K + k) * N + n];
        out[(h * M + m) * N + n] = s;
      }
  return out;
}

TEST(CudaBmm, RowMajorAndTransposedWeights) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  const int64_t B = 5, T = 7, K = 48, N = 40;
  // a as the transposed view of a [T, B, K] activation, as MLA absorption uses it.
  Tensor act = randn({T, B, K}, DType::kBF16, seed);
  Tensor act_g = to_gpu(act);
  Tensor a_view = act_g.transpose(0, 1);  // [B, T, K], stride(2) == 1
  Tensor a_host = act.transpose(0, 1);
  // b row-major [B, K, N]
  Tensor b_rm = randn({B, K, N}, DType::kBF16, seed + 1, 0.1);
  Tensor y = poisoned_gpu({B, T, N}, DType::kBF16);
  cuda::bmm(a_view, to_gpu(b_rm), y, nullptr);
  EXPECT_LT(rel_error(fetch(y), ref_bmm(a_host, b_rm)), bf16_gemm_tolerance(K));
  // b as the transposed view of per-head [B, N, K] weights, fp32 output.
  Tensor w_nk = randn({B, N, K}, DType::kBF16, seed + 2, 0.1);
  Tensor b_t = to_gpu(w_nk).transpose(1, 2);
  Tensor y32 = poisoned_gpu({B, T, N}, DType::kFP32);
  cuda::bmm(a_view, b_t, y32, nullptr);
  EXPECT_LT(rel_error(fetch(y32), ref_bmm(a_host, w_nk.transpose(1, 2))), fp32_out_gemm_tolerance(K));
  // batch subset (a partition's heads) written into its slice of y.
  Tensor y2 = poisoned_gpu({B, T, N}, DType::kBF16);
  Tensor bg = to_gpu(b_rm);
  cuda::bmm(a_view.slice(0, 0, 2), bg.slice(0, 0, 2), y2.slice(0, 0, 2), nullptr);
  cuda::bmm(a_view.slice(0, 2, B), bg.slice(0, 2, B), y2.slice(0, 2, B), nullptr);
  EXPECT_LT(rel_error(fetch(y2), ref_bmm(a_host, b_rm)), bf16_gemm_tolerance(K));
}

}  // namespace
}  // namespace locus
