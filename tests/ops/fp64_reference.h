// fp64 references for the row-wise ops (RMSNorm, RoPE, softmax), shared by the CPU op tests and
// the GPU tests. Inputs are read as their stored (rounded) values; outputs in row-major order.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/rope.h"
#include "test_util.h"

namespace locus::testing {

// x / sqrt(mean(x^2) + eps) * w per row (rows = all leading indices).
inline std::vector<double> ref_rmsnorm(const Tensor& x, const Tensor& w, double eps) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  std::vector<double> xd = to_doubles(x), wd = to_doubles(w), out(xd.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < h; ++c) ss += xd[r * h + c] * xd[r * h + c];
    const double inv = 1.0 / std::sqrt(ss / h + eps);
    for (int64_t c = 0; c < h; ++c) out[r * h + c] = xd[r * h + c] * inv * wd[c];
  }
  return out;
}

// Rotation of x [T, H, d] by the table (CPU tensors) at pos[t]: pairs (2i, 2i+1) when
// interleaved, (i, i + d/2) otherwise.
inline std::vector<double> ref_rope(const Tensor& x, const std::vector<int64_t>& pos, const ops::RopeTable& t,
                                    bool inter) {
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2), half = d / 2;
  std::vector<double> v = to_doubles(x);
  for (int64_t tk = 0; tk < tokens; ++tk)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double c = t.cos.data<float>()[pos[tk] * half + i], s = t.sin.data<float>()[pos[tk] * half + i];
        const int64_t base = (tk * heads + h) * d;
        const int64_t i0 = base + (inter ? 2 * i : i), i1 = base + (inter ? 2 * i + 1 : i + half);
        const double a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
      }
  return v;
}

// exp(x - max) / sum per row (rows = all leading indices); -inf entries give 0.
inline std::vector<double> ref_softmax(const Tensor& x) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  std::vector<double> xd = to_doubles(x), out(xd.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < n; ++c) mx = std::max(mx, xd[r * n + c]);
    for (int64_t c = 0; c < n; ++c) s += std::exp(xd[r * n + c] - mx);
    for (int64_t c = 0; c < n; ++c) out[r * n + c] = std::exp(xd[r * n + c] - mx) / s;
  }
  return out;
}

}  // namespace locus::testing
