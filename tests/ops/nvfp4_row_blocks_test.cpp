// NVFP4 products on row blocks (a MoE's experts on their rows), on the CPU: each block's rows are
// exactly nvfp4_gemm / nvfp4_gemm_swiglu on those rows, other rows are left alone, and bad blocks
// are errors that name them.
#include "ops/nvfp4_row_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/error.h"
#include "test_util.h"

namespace locus {
namespace {

using testing::bitwise_equal;
using testing::fresh_seed;
using testing::randn;

using locus::testing::error_text;

TEST(Nvfp4RowBlocks, EachBlockIsTheOpOnItsRows) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t K = 64, N = 32;
  const std::vector<int64_t> counts = {2, 0, 1, 3, 1};  // rows 0 and 8 are in no block
  for (const bool swiglu : {false, true}) {
    SCOPED_TRACE(swiglu ? "swiglu" : "plain");
    std::vector<ops::Nvfp4Weight> w;
    std::vector<ops::Nvfp4RowBlock> blocks;
    int64_t row = 1;
    for (size_t b = 0; b < counts.size(); ++b) {
      w.push_back(ops::nvfp4_quantize(randn({swiglu ? 2 * N : N, K}, DType::kBF16, seed + 10 + b, 0.2)));
      blocks.push_back({nullptr, row, counts[b]});
      row += counts[b];
    }
    for (size_t b = 0; b < w.size(); ++b) blocks[b].w = &w[b];
    const int64_t R = row + 1;
    const Tensor x = randn({R, K}, DType::kBF16, seed + 1);
    Tensor y = Tensor::empty({R, N}, DType::kFP32);
    y.fill_nan_();
    ops::nvfp4_gemm_row_blocks(x, blocks, y, swiglu);
    for (const int64_t r : {int64_t{0}, R - 1})
      for (int64_t c = 0; c < N; ++c) EXPECT_TRUE(std::isnan(y.data<float>()[r * N + c])) << "row " << r;
    for (size_t b = 0; b < counts.size(); ++b) {
      if (counts[b] == 0) continue;
      const int64_t r0 = blocks[b].row0, r1 = r0 + counts[b];
      Tensor want = Tensor::empty({counts[b], N}, DType::kFP32);
      swiglu ? ops::nvfp4_gemm_swiglu(x.slice(0, r0, r1), w[b], want)
             : ops::nvfp4_gemm(x.slice(0, r0, r1), w[b], Tensor(), want);
      EXPECT_TRUE(bitwise_equal(y.slice(0, r0, r1), want)) << "block " << b;
    }
  }
}

TEST(Nvfp4RowBlocks, BadBlocksAreNamed) {
  const ops::Nvfp4Weight w = ops::nvfp4_quantize(randn({32, 64}, DType::kBF16, 3, 0.2));
  const ops::Nvfp4Weight other_k = ops::nvfp4_quantize(randn({32, 128}, DType::kBF16, 4, 0.2));
  const Tensor x = randn({4, 64}, DType::kBF16, 5);
  const Tensor y = Tensor::empty({4, 32}, DType::kFP32);
  EXPECT_EQ(error_text([&] { ops::nvfp4_gemm_row_blocks(x, {{&w, 0, 2}, {&w, 3, 2}}, y, false); }),
            "nvfp4_gemm_row_blocks: block 1 has rows [3, 5), outside x's 4 rows");
  EXPECT_EQ(error_text([&] { ops::nvfp4_gemm_row_blocks(x, {{nullptr, 0, 1}}, y, false); }),
            "nvfp4_gemm_row_blocks: block 0 has no weight");
  const std::string k = error_text([&] { ops::nvfp4_gemm_row_blocks(x, {{&w, 0, 1}, {&other_k, 1, 2}}, y, false); });
  EXPECT_EQ(k.rfind("nvfp4_gemm_row_blocks: block 1: ", 0), 0u) << k;
  EXPECT_EQ(error_text([&] { ops::nvfp4_gemm_row_blocks(x, {}, Tensor::empty({3, 32}, DType::kFP32), false); }).rfind(
                "nvfp4_gemm_row_blocks: x and y must be 2-D with the same rows", 0),
            0u);
}

}  // namespace
}  // namespace locus
