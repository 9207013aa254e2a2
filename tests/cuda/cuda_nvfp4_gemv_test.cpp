// The NVFP4 decode matrix-vector kernel (nvfp4_gemv.h) against fp64 references of the dequantized
// weight on random inputs: every token count up to 16 (one and two blocks of 8 tokens), each block
// shape (1 or 2 tiles a warp, 1-8 warps a slot), K not a multiple of 64, N not a multiple of 16,
// biases, SwiGLU, fp32 and bf16 outputs written as a column slice of a poisoned tensor (the columns
// around it must stay poisoned); the same bits on a second call and from graph replays, and a
// replay after an in-place reload computes with the new weights; the candidate block shapes;
// cuda::nvfp4_gemm / nvfp4_gemm_swiglu, which time it against the streaming kernel at decode M,
// from a graph, on each path. (The partitioned ops: cuda_nvfp4_gemv_domains_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/nvfp4_gemv.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;
using cuda::detail::Nvfp4GemvArgs;
using cuda::detail::Nvfp4GemvShape;

struct Fp4GemvCase {
  int64_t m, n, k;  // n: output columns (SwiGLU: the weight has 2n rows)
  DType out;
  int bias;  // 0 none, 1 bf16, 2 fp32
  bool swiglu;
};

// The output sits at columns [kLeft, kLeft + n) of a poisoned [m, n + kLeft + kRight] tensor.
constexpr int64_t kLeft = 3, kRight = 5;

std::vector<double> reference(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Fp4GemvCase& c) {
  if (c.swiglu) return ref_swiglu(ref_gemm_dense(x, dequant_ref(w), 2 * c.n), c.m, c.n);
  return ref_gemm_dense(x, dequant_ref(w), c.n, bias);
}

class CudaNvfp4Gemv : public CudaCallerStream, public ::testing::WithParamInterface<Fp4GemvCase> {};

TEST_P(CudaNvfp4Gemv, EachBlockShapeMatchesFp64InItsColumnsOnlyAndRepeatsItsBits) {
  const Fp4GemvCase c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const ops::Nvfp4Weight w = random_nvfp4(c.swiglu ? 2 * c.n : c.n, c.k, seed);
  const Tensor x = randn({c.m, c.k}, DType::kBF16, seed + 1);
  Tensor bias;
  if (c.bias) bias = randn({c.n}, c.bias == 1 ? DType::kBF16 : DType::kFP32, seed + 2);
  const ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w, 0, -1);
  const Tensor xg = to_gpu(x), bg = bias.defined() ? to_gpu(bias) : Tensor();
  const int64_t width = c.n + kLeft + kRight;
  Tensor y = poisoned_gpu({c.m, width}, c.out);

  const Nvfp4GemvArgs a = cuda::detail::nvfp4_gemv_args(xg, wg, bg, y.slice(1, kLeft, kLeft + c.n), c.swiglu);
  ASSERT_TRUE(cuda::detail::nvfp4_gemv_eligible(a));

  const std::vector<double> ref = reference(x, w, bias, c);
  const double tol = c.out == DType::kBF16 ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k);
  for (const int tiles : {1, 2}) {
    if (c.swiglu && tiles == 1) continue;  // SwiGLU always streams a gate tile with its up tile
    for (const int warps : {1, 2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << tiles << " tiles a warp, " << warps << " warps a slot");
      const Nvfp4GemvShape shape{tiles, warps};
      const Tensor bits = expect_slice_and_repeats(
          y, kLeft, c.n, ref, tol, [&](cudaStream_t s) { cuda::detail::launch_nvfp4_gemv(a, shape, s); }, caller_);
      if (tiles == 1 && cuda::detail::nvfp4_gemv_lean_fits(a)) {
        // The lean form adds the same products in the same order: the same bits.
        SCOPED_TRACE("the lean form");
        const Nvfp4GemvShape lean{1, warps, true};
        const Tensor lean_bits = expect_slice_and_repeats(
            y, kLeft, c.n, ref, tol, [&](cudaStream_t s) { cuda::detail::launch_nvfp4_gemv(a, lean, s); }, caller_);
        EXPECT_TRUE(bitwise_equal(lean_bits, bits));
      }
    }
  }
}

// Token counts 1-16 (9-16: two blocks of 8); K from one 16-value block (most of a chunk padding)
// to o_proj-like 16384, K % 64 != 0 (a lane's last block past K); N not a multiple of 16 (the
// last tile's rows partly past N), a single tile, and a few hundred tiles.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaNvfp4Gemv,
                         ::testing::Values(Fp4GemvCase{1, 64, 64, DType::kBF16, 0, false},
                                           Fp4GemvCase{1, 7, 16, DType::kFP32, 1, false},
                                           Fp4GemvCase{2, 100, 1040, DType::kBF16, 2, false},
                                           Fp4GemvCase{3, 129, 2000, DType::kFP32, 0, false},
                                           Fp4GemvCase{4, 96, 7168, DType::kBF16, 1, false},
                                           Fp4GemvCase{1, 300, 16384, DType::kBF16, 0, false},
                                           Fp4GemvCase{8, 1100, 512, DType::kFP32, 2, false},
                                           Fp4GemvCase{9, 272, 1536, DType::kBF16, 0, false},
                                           Fp4GemvCase{16, 513, 208, DType::kFP32, 1, false},
                                           Fp4GemvCase{13, 48, 4096, DType::kBF16, 0, false},
                                           // 12 and 44 chunks, the last one half past K: lanes
                                           // differ in where their activations end.
                                           Fp4GemvCase{1, 40, 736, DType::kBF16, 0, false},
                                           Fp4GemvCase{12, 80, 2784, DType::kFP32, 0, false},
                                           Fp4GemvCase{1, 64, 256, DType::kBF16, 0, true},
                                           Fp4GemvCase{5, 48, 1040, DType::kBF16, 0, true},
                                           Fp4GemvCase{16, 256, 2048, DType::kFP32, 0, true},
                                           Fp4GemvCase{11, 16, 80, DType::kBF16, 0, true}));

// One token, 4 outputs, K = 16 over host buffers: what the rules take (nothing is launched).
alignas(16) const uint8_t kTinyCodes[64] = {};
alignas(16) const uint16_t kTinyBuf[64] = {};
const float kTinyScale = 1.f;
Nvfp4GemvArgs tiny_eligible_args() {
  Nvfp4GemvArgs a;
  a.x = kTinyBuf;
  a.codes = kTinyCodes;
  a.scales = kTinyBuf;
  a.global_scale = &kTinyScale;
  a.m = 1;
  a.n = 4;
  a.k = 16;
  a.x_ld = 16;
  return a;
}

TEST(CudaNvfp4GemvRules, TheLeanFormTakesTwoBlocksOfTokensOfOneWeightWithoutSwiglu) {
  Nvfp4GemvArgs a;
  a.n = 64;
  a.k = 512;
  for (const int64_t m : {1, 8, 9, 16}) {
    a.m = m;
    EXPECT_EQ(cuda::detail::nvfp4_gemv_lean_fits(a), m > 8) << m;
  }
  Nvfp4GemvArgs b = a;
  b.swiglu = true;
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_lean_fits(b));
  b = a;
  b.num_indexed = 1;  // by id: one token an entry
  b.indexed[0].entries = 16;
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_lean_fits(b));
  EXPECT_EQ(cuda::detail::nvfp4_gemv_resident_ctas(2, 1, true), 3);
  EXPECT_EQ(cuda::detail::nvfp4_gemv_resident_ctas(2, 1, false), 2);
  // A launch asked for the lean form where it does not fit is refused before anything runs.
  Nvfp4GemvArgs c = tiny_eligible_args();
  c.m = 4;
  ASSERT_TRUE(cuda::detail::nvfp4_gemv_eligible(c));
  try {
    cuda::detail::launch_nvfp4_gemv(c, Nvfp4GemvShape{1, 4, true}, nullptr);
    ADD_FAILURE() << "a lean launch at 4 tokens was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lean form"), std::string::npos) << e.what();
  }
  c.m = 12;  // two blocks of tokens, but two tiles a warp
  EXPECT_THROW(cuda::detail::launch_nvfp4_gemv(c, Nvfp4GemvShape{2, 4, true}, nullptr), Error);
}

TEST(CudaNvfp4GemvRules, TakesOnlyAlignedDecodeProblems) {
  const Nvfp4GemvArgs a = tiny_eligible_args();
  Nvfp4GemvArgs b = a;
  b.x = kTinyBuf + 1;  // rows not 16-byte aligned
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_eligible(b));
  EXPECT_TRUE(cuda::detail::nvfp4_gemv_eligible(a));
  b = a;
  b.m = cuda::detail::kNvfp4GemvMaxM + 1;
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_eligible(b));
  b = a;
  b.k = 24;  // not whole scale blocks
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_eligible(b));
  b = a;
  b.m = 2;
  b.x_ld = 20;
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_eligible(b));
  b = a;
  b.swiglu = true;  // 4 outputs: the up rows would not start on a tile
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_eligible(b));
  b.n = 16;
  EXPECT_TRUE(cuda::detail::nvfp4_gemv_eligible(b));
  b.bias = kTinyBuf;  // SwiGLU has no bias
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_eligible(b));
}

TEST(CudaNvfp4GemvRules, ShortShapesSplitKIntoPartsOfAboutEightTileChunks) {
  Nvfp4GemvArgs a;
  a.k = 7168;  // 112 chunks
  EXPECT_EQ(cuda::detail::nvfp4_gemv_short_shape(a, 1).warps_per_slot, 8);
  a.k = 2048;  // 32 chunks: 4 warps of 8
  EXPECT_EQ(cuda::detail::nvfp4_gemv_short_shape(a, 1).warps_per_slot, 4);
  EXPECT_EQ(cuda::detail::nvfp4_gemv_short_shape(a, 2).warps_per_slot, 8);  // two tiles: 4 chunks a warp
  a.k = 1536;  // 24: 2 warps of 12
  EXPECT_EQ(cuda::detail::nvfp4_gemv_short_shape(a, 1).warps_per_slot, 2);
  a.k = 512;  // 8: one warp
  EXPECT_EQ(cuda::detail::nvfp4_gemv_short_shape(a, 1).warps_per_slot, 1);
}

// On 132 SMs (3 resident CTAs an SM with one tile a warp and up to 8 tokens, or in the lean form,
// else 2): one weight (or the domain-aware launch's shards) at up to 8 tokens, the one-wave shape
// whose busiest SM streams the fewest tiles (the thirty-eighth session's sweep); else the shape
// whose waves are fullest, as the twenty-ninth and thirty-first sessions' sweeps found fastest.
TEST(CudaNvfp4GemvRules, TheBuiltInShapeFillsItsWaves) {
  // The built-in shape as (tiles a warp, warps a slot, lean form); entries > 0: a by-id product.
  auto shape = [](int64_t m, int64_t n, int64_t k, bool swiglu = false, int entries = 0, bool allow_lean = true) {
    Nvfp4GemvArgs a;
    a.m = m;
    a.n = n;
    a.k = k;
    a.swiglu = swiglu;
    if (entries > 0) {
      a.num_indexed = 1;
      a.indexed[0].entries = entries;
    }
    const Nvfp4GemvShape s = cuda::detail::nvfp4_gemv_shape(a, 132, allow_lean);
    return std::make_tuple(s.tiles_per_warp, s.warps_per_slot, s.lean);
  };
  using L = std::tuple<int, int, bool>;
  // Up to 8 tokens: the busiest SM's tiles (a tie: two tiles a warp, then more warps a slot).
  EXPECT_EQ(shape(1, 7168, 7168), L(2, 8, false));   // 224 CTAs: 4 tiles (one tile, 4 warps: 4 too)
  EXPECT_EQ(shape(1, 18432, 7168), L(1, 2, false));  // 288 CTAs: 12 tiles (two tiles, 2 warps: 16)
  EXPECT_EQ(shape(8, 18432, 7168), L(1, 2, false));
  EXPECT_EQ(shape(1, 4096, 7168), L(2, 8, false));   // 128 CTAs: 2 tiles (one tile, 8 warps: 2 too)
  EXPECT_EQ(shape(1, 24576, 1536), L(1, 2, false));  // 384 CTAs: 12 tiles
  EXPECT_EQ(shape(1, 32768, 512), L(2, 2, false));   // 256 CTAs: 16 tiles (a tie with 1 warp, and one tile)
  EXPECT_EQ(shape(1, 7168, 2048), L(2, 8, false));
  EXPECT_EQ(shape(1, 18432, 7168, false, 0, false), L(1, 2, false));  // the domain-aware kernel's too
  EXPECT_EQ(shape(16, 7168, 7168), L(2, 8, false));  // a tie (224 of 264 against 448 of 528): two tiles
  // 16 tokens: the lean form where its 3 CTAs an SM fill the waves better.
  EXPECT_EQ(shape(16, 18432, 7168), L(1, 8, true));  // 1152 short CTAs: 2.9 of 3 waves (4.4 of 5 at 2)
  EXPECT_EQ(shape(16, 24576, 1536), L(1, 2, true));  // 384 of 396 (two tiles: 192 of 264)
  EXPECT_EQ(shape(16, 4096, 7168), L(1, 8, false));  // 256 of 264 already; lean 256 of 396
  EXPECT_EQ(shape(16, 32768, 512), L(2, 2, false));  // 128 of 264 (a tie with one tile: two); lean 256 of 396
  EXPECT_EQ(shape(16, 7168, 2048), L(2, 8, false));  // 224 of 264; lean 224 of 396
  EXPECT_EQ(shape(16, 7168, 18432), L(2, 8, false));
  EXPECT_EQ(shape(16, 18432, 7168, false, 0, false), L(1, 8, false));  // the domain-aware kernel's: never lean
  EXPECT_EQ(shape(16, 24576, 1536, false, 0, false), L(2, 2, false));
  EXPECT_EQ(shape(1, 2048, 7168, true, 9), L(2, 8, false));   // a MoE's gate/up by id, 9 entries: short CTAs
  EXPECT_EQ(shape(1, 7168, 2048, false, 9), L(2, 1, false));  // its down projection: 252 CTAs of 264
  cuda::detail::set_nvfp4_gemv_shape({1, 4});  // forced (SwiGLU keeps its 2 tiles)
  EXPECT_EQ(shape(1, 7168, 7168), L(1, 4, false));
  EXPECT_EQ(shape(1, 2048, 7168, true), L(2, 4, false));
  cuda::detail::set_nvfp4_gemv_shape({1, 4, true});  // forced lean, where the form fits
  EXPECT_EQ(shape(16, 7168, 7168), L(1, 4, true));
  EXPECT_EQ(shape(4, 7168, 7168), L(1, 4, false));
  cuda::detail::set_nvfp4_gemv_shape({0, 0});
}

// A graph of the kernel replayed after an in-place reload (nvfp4_prepare_into) computes with the
// new codes, scales and global scale.
TEST_F(CudaCallerStream, Nvfp4GemvReplayAfterInPlaceReloadUsesTheNewWeight) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t M = 2, N = 200, K = 1024;
  const ops::Nvfp4Weight w1 = random_nvfp4(N, K, seed), w2 = random_nvfp4(N, K, seed + 5);
  const Tensor x = randn({M, K}, DType::kBF16, seed + 1);
  const ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w1, 0, -1);
  const Tensor xg = to_gpu(x);
  Tensor y = poisoned_gpu({M, N}, DType::kFP32);
  const Nvfp4GemvArgs a = cuda::detail::nvfp4_gemv_args(xg, wg, Tensor(), y, false);
  cuda::Graph g;
  g.begin_capture(caller_);
  cuda::detail::launch_nvfp4_gemv(a, caller_);
  g.end_capture();
  g.replay(caller_);
  EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w1), N)), fp32_out_gemm_tolerance(K));
  cuda::nvfp4_prepare_into(w2, wg);
  y.fill_nan_();
  g.replay(caller_);
  EXPECT_LT(rel_error(fetch(y), ref_gemm_dense(x, dequant_ref(w2), N)), fp32_out_gemm_tolerance(K));
}

// cuda::nvfp4_gemm / nvfp4_gemm_swiglu at decode M time the kernel against the streaming kernel
// once per problem; whichever they take, the result matches the reference, and a graph of the
// call replays its bits. With the kernel switched off, the streaming kernel alone.
TEST_F(CudaCallerStream, Nvfp4GemmAtDecodeMatchesFp64AndReplaysFromAGraph) {
  for (const Nvfp4Path p : {Nvfp4Path::kTimed, Nvfp4Path::kStreaming, Nvfp4Path::kMatrixVector}) {
    const ScopedNvfp4Path path(p);
    for (const int64_t m : {1, 4, 16}) {
      for (const bool swiglu : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "M " << m << (swiglu ? " SwiGLU, " : ", ") << nvfp4_path_name(p));
        const uint64_t seed = fresh_seed();
        SCOPED_TRACE(::testing::Message() << "seed " << seed);
        const int64_t N = 256, K = 2048;
        const ops::Nvfp4Weight w = random_nvfp4(swiglu ? 2 * N : N, K, seed);
        const Tensor x = randn({m, K}, DType::kBF16, seed + 1);
        const ops::Nvfp4Weight wg = cuda::nvfp4_prepare(w, 0, -1);
        const Tensor xg = to_gpu(x);
        Tensor y = poisoned_gpu({m, N}, DType::kBF16);
        auto call = [&] {
          if (swiglu) cuda::nvfp4_gemm_swiglu(xg, wg, y, caller_);
          else cuda::nvfp4_gemm(xg, wg, {}, y, caller_);
        };
        call();
        const Tensor eager = fetch(y);
        const std::vector<double> ref = swiglu ? ref_swiglu(ref_gemm_dense(x, dequant_ref(w), 2 * N), m, N)
                                               : ref_gemm_dense(x, dequant_ref(w), N);
        EXPECT_LT(rel_error(eager, ref), bf16_gemm_tolerance(K));
        y.fill_nan_();
        cuda::Graph g;
        g.begin_capture(caller_);
        call();
        g.end_capture();
        g.replay(caller_);
        EXPECT_TRUE(bitwise_equal(fetch(y), eager));
      }
    }
  }
}

}  // namespace
}  // namespace locus
