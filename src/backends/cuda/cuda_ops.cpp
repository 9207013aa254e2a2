// BF16 GEMM, GEMM+SwiGLU, SwiGLU and BMM on CUDA (cuda_ops.h): shape checks, then cuBLASLt
// (cublaslt_matmul.h) and our elementwise kernels.
#include "backends/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>

#include "backends/cuda/bf16_gemm.h"
#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/cublaslt_matmul.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/path_choice.h"

namespace locus::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

void check_on_cuda(const Tensor& t, const char* op, const char* name, int device) {
  LOCUS_CHECK(t.defined(), op, ": ", name, " is undefined");
  LOCUS_CHECK(t.device().is_cuda(), op, ": ", name, " must be on a CUDA device, got ", t.describe());
  LOCUS_CHECK(t.device().index == device, op, ": ", name, " is on ", t.device().name(), ", other operands on cuda:",
              device);
}

void check_float_out(const Tensor& y, const char* op) {
  LOCUS_CHECK(y.dtype() == DType::kBF16 || y.dtype() == DType::kFP32, op, ": output must be bf16 or fp32, got ",
              y.describe());
}


// Checks x [M,K], w [N,K] bf16 row-major and y [M, N] (N = out_cols) row-major; returns M, N, K.
void check_gemm_operands(const char* op, const Tensor& x, const Tensor& w, const Tensor& y, int64_t out_cols_per_w_rows,
                         int64_t* m, int64_t* n, int64_t* k) {
  const int dev = x.defined() ? x.device().index : 0;
  check_on_cuda(x, op, "x", dev);
  check_on_cuda(w, op, "w", dev);
  check_on_cuda(y, op, "y", dev);
  LOCUS_CHECK(x.dtype() == DType::kBF16 && x.is_row_major_2d(), op, ": x must be bf16 [M, K] with stride(1) == 1, got ",
              x.describe());
  LOCUS_CHECK(w.dtype() == DType::kBF16 && w.is_row_major_2d(), op, ": w must be bf16 [N, K] with stride(1) == 1, got ",
              w.describe());
  LOCUS_CHECK(w.size(1) == x.size(1), op, ": x ", x.shape_str(), " and w ", w.shape_str(), " disagree on K");
  check_float_out(y, op);
  LOCUS_CHECK(y.dim() == 2 && y.stride(1) == 1 && y.stride(0) >= y.size(1), op,
              ": y must be [M, N] with stride(1) == 1, got ", y.describe());
  const int64_t cols = out_cols_per_w_rows == 1 ? w.size(0) : w.size(0) / 2;
  LOCUS_CHECK(y.size(0) == x.size(0) && y.size(1) == cols, op, ": y ", y.shape_str(), " should be [", x.size(0), ", ",
              cols, "] for x ", x.shape_str(), " and w ", w.shape_str());
  *m = x.size(0);
  *n = w.size(0);
  *k = x.size(1);
}

// y(col-major D, N x M) = w(T) * x by cuBLASLt.
void lt_gemm_into(const Tensor& x, const detail::Bf16Weight& w, const void* bias, bool bias_f32, void* y, int64_t ldy,
                  bool y_f32, cudaStream_t stream) {
  detail::LtMatmul mm;
  mm.trans_a = true;
  mm.trans_b = false;
  mm.m = w.n;
  mm.n = x.size(0);
  mm.k = x.size(1);
  mm.lda = w.ld;
  mm.ldb = x.stride(0);
  mm.ldd = ldy;
  mm.a = w.data;
  mm.b = x.data_ptr();
  mm.d = y;
  mm.d_f32 = y_f32;
  mm.bias = bias;
  mm.bias_f32 = bias_f32;
  mm.alpha_device = w.alpha_device;
  detail::lt_matmul(mm, stream);
}

// The same, at decode M by the faster (timed once per problem, path_choice.h) of cuBLASLt and
// our matrix-vector kernel (bf16_gemv.h); LOCUS_BF16_GEMV=0 leaves it to cuBLASLt.
void gemm_into(const Tensor& x, const detail::Bf16Weight& w, const void* bias, bool bias_f32, void* y, int64_t ldy,
               bool y_f32, cudaStream_t stream) {
  detail::Bf16GemvArgs g;
  g.x = x.data_ptr();
  g.x_ld = x.stride(0);
  g.w = w.data;
  g.w_ld = w.ld;
  g.bias = bias;
  g.bias_f32 = bias_f32;
  g.alpha = w.alpha_device;
  g.y = y;
  g.y_ld = ldy;
  g.y_f32 = y_f32;
  g.m = x.size(0);
  g.n = w.n;
  g.k = x.size(1);
  if (!detail::bf16_gemv_enabled() || !detail::bf16_gemv_eligible(g)) {
    lt_gemm_into(x, w, bias, bias_f32, y, ldy, y_f32, stream);
    return;
  }
  detail::run_fastest_path(detail::bf16_gemv_problem_key(g, stream),
                           {[&](cudaStream_t s) { lt_gemm_into(x, w, bias, bias_f32, y, ldy, y_f32, s); },
                            [&](cudaStream_t s) { detail::launch_bf16_gemv(g, s); }},
                           stream);
}

detail::Bf16Weight weight_of(const Tensor& w) { return {w.data_ptr(), w.stride(0), w.size(0), nullptr}; }

}  // namespace

namespace detail {

void bf16_gemm(const Tensor& x, const Bf16Weight& w, const Tensor& bias, const Tensor& y, cudaStream_t s) {
  const int64_t m = x.size(0), n = w.n;
  if (m == 0 || n == 0) return;
  const bool y_f32 = y.dtype() == DType::kFP32;
  if (bias.defined() && y_f32 && bias.dtype() == DType::kBF16) {
    // cuBLASLt wants an fp32 bias for fp32 output: widen it into stream-ordered scratch.
    float* b32 = static_cast<float*>(scratch_alloc(n * sizeof(float), s));
    launch_bf16_to_f32(bias.data<uint16_t>(), b32, n, s);
    gemm_into(x, w, b32, true, y.data_ptr(), y.stride(0), true, s);
    scratch_free(b32, s);
    return;
  }
  if (bias.defined() && !y_f32 && bias.dtype() == DType::kFP32) {
    // cuBLASLt has no fp32 bias for a bf16 output: fp32 result (+ fp32 bias) in scratch, then
    // one rounding into y.
    float* y32 = static_cast<float*>(scratch_alloc(static_cast<size_t>(m * n) * sizeof(float), s));
    gemm_into(x, w, bias.data_ptr(), true, y32, n, true, s);
    launch_f32_to_bf16_2d(y32, n, y.data<uint16_t>(), y.stride(0), m, n, s);
    scratch_free(y32, s);
    return;
  }
  gemm_into(x, w, bias.defined() ? bias.data_ptr() : nullptr, bias.defined() && bias.dtype() == DType::kFP32,
            y.data_ptr(), y.stride(0), y_f32, s);
}

void bf16_gemm_swiglu(const Tensor& x, const Bf16Weight& w, const Tensor& y, cudaStream_t s) {
  const int64_t m = x.size(0), n2 = w.n, inter = n2 / 2;
  if (m == 0 || n2 == 0) return;
  // fp32 gate/up accumulators in scratch, then SwiGLU rounds once into y.
  float* gu = static_cast<float*>(scratch_alloc(static_cast<size_t>(m * n2) * sizeof(float), s));
  gemm_into(x, w, nullptr, false, gu, n2, true, s);
  SwigluArgs a{gu, gu + inter, n2, n2, true, y.data_ptr(), y.stride(0), y.dtype() == DType::kFP32, m, inter};
  launch_swiglu(a, s);
  scratch_free(gu, s);
}

}  // namespace detail

void gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, void* stream) {
  int64_t m, n, k;
  check_gemm_operands("cuda::gemm", x, w, y, 1, &m, &n, &k);
  if (bias.defined()) {
    check_on_cuda(bias, "cuda::gemm", "bias", x.device().index);
    LOCUS_CHECK((bias.dtype() == DType::kBF16 || bias.dtype() == DType::kFP32) && bias.dim() == 1 &&
                    bias.size(0) == n && bias.stride(0) == 1,
                "cuda::gemm: bias must be a dense bf16/fp32 [", n, "], got ", bias.describe());
  }
  if (m == 0 || n == 0) return;
  use_device(x.device().index);
  if (m <= stream_gemm_bf16_max_m() && stream_gemm(x, w, bias, y, false, stream)) return;
  detail::bf16_gemm(x, weight_of(w), bias, y, as_stream(stream));
}

void gemm_swiglu(const Tensor& x, const Tensor& w_gate_up, const Tensor& y, void* stream) {
  int64_t m, n2, k;
  LOCUS_CHECK(w_gate_up.defined() && w_gate_up.dim() == 2 && w_gate_up.size(0) % 2 == 0,
              "cuda::gemm_swiglu: w_gate_up must be [2I, K] with an even row count, got ", w_gate_up.describe());
  check_gemm_operands("cuda::gemm_swiglu", x, w_gate_up, y, 2, &m, &n2, &k);
  if (m == 0 || n2 == 0) return;
  use_device(x.device().index);
  if (m <= stream_gemm_bf16_max_m() && stream_gemm(x, w_gate_up, Tensor(), y, true, stream)) return;
  detail::bf16_gemm_swiglu(x, weight_of(w_gate_up), y, as_stream(stream));
}

void swiglu(const Tensor& gate_up, const Tensor& y, void* stream) {
  const int dev = gate_up.defined() ? gate_up.device().index : 0;
  check_on_cuda(gate_up, "cuda::swiglu", "gate_up", dev);
  check_on_cuda(y, "cuda::swiglu", "y", dev);
  LOCUS_CHECK((gate_up.dtype() == DType::kBF16 || gate_up.dtype() == DType::kFP32) && gate_up.dim() == 2 &&
                  gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "cuda::swiglu: gate_up must be bf16/fp32 [M, 2I] with stride(1) == 1, got ", gate_up.describe());
  check_float_out(y, "cuda::swiglu");
  const int64_t m = gate_up.size(0), inter = gate_up.size(1) / 2;
  LOCUS_CHECK(y.dim() == 2 && y.stride(1) == 1 && y.size(0) == m && y.size(1) == inter, "cuda::swiglu: y must be [", m,
              ", ", inter, "] with stride(1) == 1, got ", y.describe());
  use_device(dev);
  const bool f32 = gate_up.dtype() == DType::kFP32;
  const char* base = static_cast<const char*>(gate_up.data_ptr());
  detail::SwigluArgs a{base, base + inter * dtype_size(gate_up.dtype()), gate_up.stride(0), gate_up.stride(0), f32,
                       y.data_ptr(), y.stride(0), y.dtype() == DType::kFP32, m, inter};
  detail::launch_swiglu(a, as_stream(stream));
}

void bmm(const Tensor& a, const Tensor& b, const Tensor& y, void* stream) {
  const int dev = a.defined() ? a.device().index : 0;
  check_on_cuda(a, "cuda::bmm", "a", dev);
  check_on_cuda(b, "cuda::bmm", "b", dev);
  check_on_cuda(y, "cuda::bmm", "y", dev);
  LOCUS_CHECK(a.dtype() == DType::kBF16 && a.dim() == 3 && a.stride(2) == 1,
              "cuda::bmm: a must be bf16 [B, M, K] with stride(2) == 1, got ", a.describe());
  LOCUS_CHECK(b.dtype() == DType::kBF16 && b.dim() == 3, "cuda::bmm: b must be bf16 [B, K, N], got ", b.describe());
  const int64_t B = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  LOCUS_CHECK(b.size(0) == B && b.size(1) == K, "cuda::bmm: b ", b.shape_str(), " does not match a ", a.shape_str());
  check_float_out(y, "cuda::bmm");
  LOCUS_CHECK(y.dim() == 3 && y.size(0) == B && y.size(1) == M && y.size(2) == N && y.stride(2) == 1,
              "cuda::bmm: y must be [", B, ", ", M, ", ", N, "] with stride(2) == 1, got ", y.describe());
  const bool b_row_major = b.stride(2) == 1 && b.stride(1) >= N;
  const bool b_transposed = !b_row_major && b.stride(1) == 1 && b.stride(2) >= K;
  LOCUS_CHECK(b_row_major || b_transposed,
              "cuda::bmm: b must be row-major [B, K, N] (stride(2) == 1) or a transposed [B, N, K] view (stride(1) == 1), "
              "got strides ", shape_to_string(b.strides()));
  LOCUS_CHECK(a.stride(1) >= K || M == 1, "cuda::bmm: a's row stride ", a.stride(1), " is smaller than K = ", K);
  if (B == 0 || M == 0 || N == 0) return;
  use_device(dev);
  if (M <= stream_gemm_bf16_max_m() && stream_bmm(a, b, y, stream)) return;
  // Row-major y[b] = a[b] b[b]  <=>  column-major y^T (N x M) = b^T (N x K) a^T (K x M).
  detail::LtMatmul mm;
  mm.trans_a = b_transposed;
  mm.trans_b = false;
  mm.m = N;
  mm.n = M;
  mm.k = K;
  mm.lda = b_row_major ? b.stride(1) : b.stride(2);
  mm.ldb = M == 1 ? std::max<int64_t>(a.stride(1), K) : a.stride(1);
  mm.ldd = M == 1 ? std::max<int64_t>(y.stride(1), N) : y.stride(1);
  mm.batch = B;
  mm.stride_a = b.stride(0);
  mm.stride_b = a.stride(0);
  mm.stride_d = y.stride(0);
  mm.a = b.data_ptr();
  mm.b = a.data_ptr();
  mm.d = y.data_ptr();
  mm.d_f32 = y.dtype() == DType::kFP32;
  detail::lt_matmul(mm, as_stream(stream));
}

}  // namespace locus::cuda
