// CPU BF16 GEMM y = x w^T (+bias), fused gate/up SwiGLU GEMM, and the unfused SwiGLU.
#include <cstring>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/dot_driver.h"
#include "backends/cpu/elem_access.h"
#include "backends/cpu/pack.h"

namespace locus::cpu {
namespace {

// bf16 weight rows read in place. gate_up: output column c uses rows c and half + c.
template <int RowsPerCol>
struct Bf16Rows {
  using Elem = uint16_t;
  static constexpr int kRowsPerCol = RowsPerCol;
  const uint16_t* base;
  int64_t ld;
  int64_t half;  // offset of the second row block (RowsPerCol == 2)
  void rows(int64_t, int64_t j0, int64_t nj, const uint16_t** p, std::vector<float>&) const {
    for (int64_t c = 0; c < nj; ++c) p[c] = base + (j0 + c) * ld;
    if (RowsPerCol == 2)
      for (int64_t c = 0; c < nj; ++c) p[nj + c] = base + (half + j0 + c) * ld;
  }
};

}  // namespace

void gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, ThreadPool& pool) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  std::vector<float> xf = detail::pack_rows_f32(x, pool);
  std::vector<float> bf;
  if (bias.defined()) bf = detail::pack_rows_f32(bias, pool);
  const detail::OutRows out(y);
  Bf16Rows<1> src{w.data<uint16_t>(), w.stride(0), 0};
  const float* bp = bf.empty() ? nullptr : bf.data();
  detail::run_dot_panels(
      1, m, n, k, {xf.data(), k, 0}, src,
      detail::bias_store_epilogue(out, bp), pool);
}

void gemm_swiglu(const Tensor& x, const Tensor& w_gate_up, const Tensor& y, ThreadPool& pool) {
  const int64_t m = x.size(0), k = x.size(1), inter = w_gate_up.size(0) / 2;
  std::vector<float> xf = detail::pack_rows_f32(x, pool);
  const detail::OutRows out(y);
  Bf16Rows<2> src{w_gate_up.data<uint16_t>(), w_gate_up.stride(0), inter};
  detail::run_dot_panels(
      1, m, inter, k, {xf.data(), k, 0}, src,
      detail::swiglu_store_epilogue(out), pool);
}

void swiglu(const Tensor& gate_up, const Tensor& y, ThreadPool& pool) {
  const int64_t m = gate_up.size(0), inter = y.size(1);
  const DType dt = gate_up.dtype();
  const void* in = gate_up.data_ptr();
  const int64_t ld_in = gate_up.stride(0);
  const detail::OutRows out(y);
  pool.parallel_for(m, std::max<int64_t>(1, 8192 / std::max<int64_t>(inter, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < inter; ++c) {
        const float g = detail::load_f32(in, dt, r * ld_in + c);
        const float u = detail::load_f32(in, dt, r * ld_in + inter + c);
        out.store(r, c, detail::silu_mul(g, u));
      }
  });
}

}  // namespace locus::cpu
