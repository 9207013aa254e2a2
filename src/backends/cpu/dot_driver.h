// Blocked, threaded driver around dot_tile(): splits a (batched) product into tasks of
// (batch, column panel, row block), runs each task's tiles over K blocks, and hands the finished
// fp32 dot products to an epilogue that rounds and stores them. Blocking only chooses which
// dots are computed together; it never changes how one dot is computed (see dot_kernel.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cpu/dot_kernel.h"
#include "backends/cpu/thread_pool.h"

namespace locus::cpu::detail {

// fp32 left operand: row i of batch b starts at data + b * batch_stride + i * ld.
struct XOperand {
  const float* data = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

constexpr int64_t kKBlock = 256;  // K elements per block: keeps the x block and w panel in L1/L2
constexpr int64_t kMBlock = 48;   // x rows per task
constexpr int64_t kPanelRows = 16;  // w rows per task

// Source: the right operand, one "w row" per dot product.
//   using Elem = float or uint16_t (bf16 bits);
//   static constexpr int kRowsPerCol: w rows consumed per output column (2 for gate/up);
//   void rows(int64_t b, int64_t j0, int64_t nj, const Elem** ptrs, std::vector<float>& scratch) const:
//     pointers to the kRowsPerCol * nj rows of the panel for output columns [j0, j0 + nj), each
//     with K readable elements; a source that has to convert may fill `scratch` and point into it.
// Epi: operator()(b, m0, mb, j0, nj, res, ldr): res[i * ldr + r] is the dot of x row m0 + i with
//   panel row r (for kRowsPerCol == 2: r < nj are the first rows, nj + c the second of column c).
template <class Source, class Epi>
void run_dot_panels(int64_t batches, int64_t m, int64_t n, int64_t k, XOperand x, const Source& src, const Epi& epi,
                    ThreadPool& pool) {
  if (batches <= 0 || m <= 0 || n <= 0) return;
  using Elem = typename Source::Elem;
  constexpr int64_t rpc = Source::kRowsPerCol;
  const TileShape ts = preferred_tile(m);
  const int64_t mb = std::min<int64_t>(m, kMBlock);
  const int64_t n_mb = (m + mb - 1) / mb;
  int64_t nj = std::max<int64_t>(1, kPanelRows / rpc);
  // Small problems: narrower panels so every thread gets work.
  while (nj > 1 && batches * n_mb * ((n + nj - 1) / nj) < 4 * static_cast<int64_t>(pool.num_threads())) nj = (nj + 1) / 2;
  const int64_t n_pan = (n + nj - 1) / nj;
  const int64_t tasks = batches * n_pan * n_mb;

  pool.parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> acc, res, scratch;
    thread_local std::vector<const Elem*> wrows;
    thread_local std::vector<const float*> xrows;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (n_pan * n_mb);
      const int64_t pan = (t / n_mb) % n_pan;
      const int64_t blk = t % n_mb;
      const int64_t j0 = pan * nj, cols = std::min(nj, n - j0), rows = cols * rpc;
      const int64_t m0 = blk * mb, mlen = std::min(mb, m - m0);
      wrows.assign(static_cast<size_t>(rows), nullptr);
      src.rows(b, j0, cols, wrows.data(), scratch);
      xrows.resize(static_cast<size_t>(mlen));
      for (int64_t i = 0; i < mlen; ++i) xrows[i] = x.data + b * x.batch_stride + (m0 + i) * x.ld;
      acc.assign(static_cast<size_t>(mlen * rows * kDotLanes), 0.f);
      const float* xp[kMaxTileM];
      const Elem* wp[kMaxTileN];
      for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
        const int64_t klen = std::min(kKBlock, k - k0);
        for (int64_t i0 = 0; i0 < mlen; i0 += ts.mr) {
          const int mr = static_cast<int>(std::min<int64_t>(ts.mr, mlen - i0));
          for (int i = 0; i < mr; ++i) xp[i] = xrows[i0 + i] + k0;
          for (int64_t r0 = 0; r0 < rows; r0 += ts.nr) {
            const int nr = static_cast<int>(std::min<int64_t>(ts.nr, rows - r0));
            for (int j = 0; j < nr; ++j) wp[j] = wrows[r0 + j] + k0;
            dot_tile(mr, nr, xp, wp, klen, acc.data() + (i0 * rows + r0) * kDotLanes, rows);
          }
        }
      }
      res.resize(static_cast<size_t>(mlen * rows));
      for (int64_t e = 0; e < mlen * rows; ++e) res[e] = reduce_lanes(acc.data() + e * kDotLanes);
      epi(b, m0, mlen, j0, cols, res.data(), rows);
    }
  });
}

}  // namespace locus::cpu::detail
