// fp64 reference of ops::mla_attention and its tolerance, shared by the CPU and CUDA tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "test_util.h"

namespace locus::testing {

// Causal split-score attention in fp64 on CPU tensors (any strides; one-head k/v shared):
// out[t, h] = sum_s softmax_s((q_a.k_a + q_b.k_b) * scale) v[s], keys s <= q_start + t.
// Rows (t, h) are spread over threads; each row is computed in a fixed order.
inline std::vector<double> ref_attention(const Tensor& qa, const Tensor& qb, const Tensor& ka, const Tensor& kb,
                                         const Tensor& v, double scale, int64_t q_start) {
  const int64_t T = qa.size(0), H = qa.size(1), Da = qa.size(2), Db = qb.size(2), Dv = v.size(2);
  struct Dense {  // [rows, heads, dim] as doubles; a one-head operand serves every head
    std::vector<double> x;
    int64_t heads, dim;
    const double* row(int64_t i, int64_t h) const { return x.data() + (i * heads + (heads == 1 ? 0 : h)) * dim; }
  };
  auto dense = [](const Tensor& t) { return Dense{to_doubles(t), t.size(1), t.size(2)}; };
  const Dense q_a = dense(qa), q_b = dense(qb), k_a = dense(ka), k_b = dense(kb), vv = dense(v);
  std::vector<double> out(static_cast<size_t>(T * H * Dv));
  auto run_rows = [&](int64_t begin, int64_t end) {
    std::vector<double> s;
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t t = idx / H, h = idx % H, n = q_start + t + 1;
      s.assign(static_cast<size_t>(n), 0.0);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        const double *qa_r = q_a.row(t, h), *ka_r = k_a.row(j, h), *qb_r = q_b.row(t, h), *kb_r = k_b.row(j, h);
        for (int64_t k = 0; k < Da; ++k) d += qa_r[k] * ka_r[k];
        for (int64_t k = 0; k < Db; ++k) d += qb_r[k] * kb_r[k];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      double* o = out.data() + idx * Dv;
      for (int64_t j = 0; j < n; ++j) {
        const double* v_r = vv.row(j, h);
        for (int64_t d = 0; d < Dv; ++d) o[d] += s[j] * v_r[d];
      }
      for (int64_t d = 0; d < Dv; ++d) o[d] /= sum;
    }
  };
  const int64_t rows = T * H;
  const int64_t workers = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(rows, 1));
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) pool.emplace_back(run_rows, rows * w / workers, rows * (w + 1) / workers);
  for (auto& th : pool) th.join();
  return out;
}

// Relative-error bound of an attention output against the fp64 reference on the same inputs:
// two fp32 reductions in a row, the dot products over Da + Db and the weighted sum over up to S
// keys (fp32_out_gemm_tolerance each); a bf16 output adds its rounding (bf16_gemm_tolerance).
inline double attention_tolerance(DType out, int64_t qk_dim, int64_t keys) {
  return out == DType::kFP32 ? fp32_out_gemm_tolerance(qk_dim) + fp32_out_gemm_tolerance(keys)
                             : bf16_gemm_tolerance(keys);
}

}  // namespace locus::testing
