// Dispatch and validation for the dense products (ops/gemm.h).
#include "ops/gemm.h"

#include "backends/cpu/cpu_ops.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_ops.h"
#endif

namespace locus::ops {
namespace {

// A 2-D operand with dense rows: rank 2, unit column stride, row stride >= width.
void check_rows(const char* op, const char* name, const Tensor& t, std::initializer_list<DType> dtypes) {
  checks::rank(op, name, t, 2);
  checks::dtype(op, name, t, dtypes);
  LOCUS_CHECK(t.size(1) <= 1 || t.stride(1) == 1, op, ": ", name, " needs unit column stride, got strides ",
              shape_to_string(t.strides()), " for ", t.describe());
  LOCUS_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1), op, ": ", name, " has row stride ", t.stride(0),
              " smaller than its width ", t.size(1));
}

void check_output(const char* op, const Tensor& y, int64_t m, int64_t n) {
  check_rows(op, "y", y, {DType::kBF16, DType::kFP32});
  LOCUS_CHECK(y.size(0) == m && y.size(1) == n, op, ": y has shape ", y.shape_str(), " but the product is [", m,
              ", ", n, "]");
}

void check_bias(const char* op, const Tensor& bias, const Tensor& x, int64_t n) {
  if (!bias.defined()) return;
  checks::rank(op, "bias", bias, 1);
  checks::dtype(op, "bias", bias, {DType::kBF16, DType::kFP32});
  checks::same_device(op, "bias", bias, "x", x);
  LOCUS_CHECK(bias.size(0) == n, op, ": bias has ", bias.size(0), " elements but the output has N=", n);
  LOCUS_CHECK(n <= 1 || bias.stride(0) == 1, op, ": bias must be contiguous, got stride ", bias.stride(0));
}

}  // namespace

void gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Stream& stream) {
  const char* op = "gemm";
  check_rows(op, "x", x, {DType::kBF16});
  check_rows(op, "w", w, {DType::kBF16});
  LOCUS_CHECK(w.size(1) == x.size(1), op, ": w has K=", w.size(1), " but x has K=", x.size(1));
  checks::same_device(op, "w", w, "x", x);
  check_bias(op, bias, x, w.size(0));
  check_output(op, y, x.size(0), w.size(0));
  checks::same_device(op, "y", y, "x", x);
  checks::no_overlap(op, "y", y, "x", x);
  checks::no_overlap(op, "y", y, "w", w);
  checks::no_overlap(op, "y", y, "bias", bias);
  if (x.device().is_cpu()) return cpu::gemm(x, w, bias, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  return cuda::gemm(x, w, bias, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

void gemm_swiglu(const Tensor& x, const Tensor& w_gate_up, const Tensor& y, const Stream& stream) {
  const char* op = "gemm_swiglu";
  check_rows(op, "x", x, {DType::kBF16});
  check_rows(op, "w_gate_up", w_gate_up, {DType::kBF16});
  LOCUS_CHECK(w_gate_up.size(1) == x.size(1), op, ": w_gate_up has K=", w_gate_up.size(1), " but x has K=",
              x.size(1));
  LOCUS_CHECK(w_gate_up.size(0) % 2 == 0, op, ": w_gate_up must hold gate and up rows (2I), got ",
              w_gate_up.size(0), " rows");
  checks::same_device(op, "w_gate_up", w_gate_up, "x", x);
  check_output(op, y, x.size(0), w_gate_up.size(0) / 2);
  checks::same_device(op, "y", y, "x", x);
  checks::no_overlap(op, "y", y, "x", x);
  checks::no_overlap(op, "y", y, "w_gate_up", w_gate_up);
  if (x.device().is_cpu()) return cpu::gemm_swiglu(x, w_gate_up, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  return cuda::gemm_swiglu(x, w_gate_up, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

void swiglu(const Tensor& gate_up, const Tensor& y, const Stream& stream) {
  const char* op = "swiglu";
  check_rows(op, "gate_up", gate_up, {DType::kBF16, DType::kFP32});
  LOCUS_CHECK(gate_up.size(1) % 2 == 0, op, ": gate_up must have 2I columns, got ", gate_up.size(1));
  check_output(op, y, gate_up.size(0), gate_up.size(1) / 2);
  checks::same_device(op, "y", y, "gate_up", gate_up);
  checks::no_overlap(op, "y", y, "gate_up", gate_up);
  if (y.device().is_cpu()) return cpu::swiglu(gate_up, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  return cuda::swiglu(gate_up, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", y.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
