// CPU batched GEMM y[b] = a[b] * b_mat[b] (MLA weight absorption), threaded over batch and tiles.
#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/dot_driver.h"
#include "backends/cpu/elem_access.h"
#include "backends/cpu/pack.h"

namespace locus::cpu {
namespace {

// b stored K-contiguous per output column (a transposed view of a per-head [N, K] weight):
// column n of batch b is a ready dot-product row.
struct ColumnsInPlace {
  using Elem = uint16_t;
  static constexpr int kRowsPerCol = 1;
  const uint16_t* base;
  int64_t batch_stride, col_stride;
  void rows(int64_t b, int64_t j0, int64_t nj, const uint16_t** p, std::vector<float>&) const {
    for (int64_t c = 0; c < nj; ++c) p[c] = base + b * batch_stride + (j0 + c) * col_stride;
  }
};

// b stored row-major [K, N]: the panel's columns are gathered into fp32 rows (exact conversion,
// so the dots are bit-identical to the in-place case).
struct ColumnsGathered {
  using Elem = float;
  static constexpr int kRowsPerCol = 1;
  const uint16_t* base;
  int64_t batch_stride, row_stride, k;
  void rows(int64_t b, int64_t j0, int64_t nj, const float** p, std::vector<float>& scratch) const {
    scratch.resize(static_cast<size_t>(nj * k));
    const uint16_t* src = base + b * batch_stride + j0;
    for (int64_t kk = 0; kk < k; ++kk) {
      const uint16_t* row = src + kk * row_stride;
      for (int64_t c = 0; c < nj; ++c) scratch[c * k + kk] = bf16_bits_to_f32(row[c]);
    }
    for (int64_t c = 0; c < nj; ++c) p[c] = scratch.data() + c * k;
  }
};

}  // namespace

void bmm(const Tensor& a, const Tensor& b, const Tensor& y, ThreadPool& pool) {
  const int64_t batches = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  std::vector<float> af = detail::pack_rows_f32(a, pool);
  const detail::XOperand xo{af.data(), k, m * k};
  const detail::OutRows out(y, y.stride(1));
  const int64_t y_bs = y.stride(0);
  auto epi = [&](int64_t bi, int64_t m0, int64_t mb, int64_t j0, int64_t nj, const float* res, int64_t ldr) {
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t c = 0; c < nj; ++c) out.store_at(bi * y_bs + (m0 + i) * out.ld + j0 + c, res[i * ldr + c]);
  };
  const uint16_t* bp = b.data<uint16_t>();
  if (b.stride(1) == 1 || k == 1) {
    detail::run_dot_panels(batches, m, n, k, xo, ColumnsInPlace{bp, b.stride(0), b.stride(2)}, epi, pool);
  } else {
    detail::run_dot_panels(batches, m, n, k, xo, ColumnsGathered{bp, b.stride(0), b.stride(1), k}, epi, pool);
  }
}

}  // namespace locus::cpu
