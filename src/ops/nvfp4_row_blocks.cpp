#include "ops/nvfp4_row_blocks.h"

#include "core/error.h"

#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_ops.h"
#endif

namespace locus::ops {

void nvfp4_gemm_row_blocks(const Tensor& x, const std::vector<Nvfp4RowBlock>& blocks, const Tensor& y, bool swiglu,
                           const Stream& stream) {
  const char* op = "nvfp4_gemm_row_blocks";
  LOCUS_CHECK(x.defined() && x.dim() == 2 && y.defined() && y.dim() == 2 && x.size(0) == y.size(0), op,
              ": x and y must be 2-D with the same rows, got ", x.defined() ? x.describe() : std::string("undefined"),
              " and ", y.defined() ? y.describe() : std::string("undefined"));
  std::vector<size_t> each;  // the blocks no shared launch took, for one op each
  for (size_t b = 0; b < blocks.size(); ++b) {
    const Nvfp4RowBlock& k = blocks[b];
    LOCUS_CHECK(k.w != nullptr, op, ": block ", b, " has no weight");
    LOCUS_CHECK(k.row0 >= 0 && k.rows >= 0 && k.row0 + k.rows <= x.size(0), op, ": block ", b, " has rows [", k.row0,
                ", ", k.row0 + k.rows, "), outside x's ", x.size(0), " rows");
    if (k.rows > 0) each.push_back(b);
  }
#if defined(LOCUS_WITH_CUDA)
  if (x.device().is_cuda()) each = cuda::nvfp4_gemm_row_blocks(x, blocks, y, swiglu, stream.native);
#endif
  for (const size_t b : each) {
    const Nvfp4RowBlock& k = blocks[b];
    const Tensor xs = x.slice(0, k.row0, k.row0 + k.rows), ys = y.slice(0, k.row0, k.row0 + k.rows);
    try {
      swiglu ? nvfp4_gemm_swiglu(xs, *k.w, ys, stream) : nvfp4_gemm(xs, *k.w, Tensor(), ys, stream);
    } catch (const Error& e) {
      throw Error(str(op, ": block ", b, ": ", e.what()));
    }
  }
}

}  // namespace locus::ops
