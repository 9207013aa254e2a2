// Dispatch and validation for NVFP4 weights and the NVFP4 x BF16 GEMM (ops/nvfp4.h).
#include "ops/nvfp4.h"

#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "backends/cpu/elem_access.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_ops.h"
#endif

namespace locus::ops {
namespace {

void check_quantize_input(const Tensor& w) {
  const char* op = "nvfp4_quantize";
  checks::rank(op, "w", w, 2);
  checks::dtype(op, "w", w, {DType::kBF16, DType::kFP32, DType::kFP16});
  LOCUS_CHECK(w.device().is_cpu(), op, ": w must be a CPU tensor, got ", w.describe());
  LOCUS_CHECK(w.size(1) % 16 == 0, op, ": K=", w.size(1), " is not a multiple of the block size 16");
  // A non-finite weight would poison its block's scale; name the first one.
  const int64_t i = cpu::first_non_finite(w, cpu::ThreadPool::global());
  if (i >= 0) {
    const float v = cpu::detail::load_f32(w.data_ptr(), w.dtype(), cpu::detail::elem_offset(w, i));
    LOCUS_THROW(op, ": w[", i / w.size(1), ", ", i % w.size(1), "] = ", v, " is not finite");
  }
}

void check_global_scale(const char* op, float g) {
  LOCUS_CHECK(std::isfinite(g) && g > 0.f, op, ": global_scale must be a positive finite number, got ", g);
}

// A kLinear weight's tensors: packed [n, k/2], scales [n, k/16], dense rows, one device.
void check_linear(const char* op, const Nvfp4Weight& w) {
  LOCUS_CHECK(w.layout == Nvfp4Layout::kLinear, op, ": the weight must be in the linear (checkpoint) layout");
  checks::rank(op, "w.packed", w.packed, 2);
  checks::rank(op, "w.scales", w.scales, 2);
  checks::dtype(op, "w.packed", w.packed, {DType::kFP4E2M1x2, DType::kU8});
  checks::dtype(op, "w.scales", w.scales, {DType::kFP8E4M3, DType::kU8});
  LOCUS_CHECK(w.k % 16 == 0 && w.k >= 0 && w.n >= 0, op, ": weight shape [", w.n, ", ", w.k,
              "] needs K to be a multiple of 16");
  LOCUS_CHECK(w.packed.size(0) == w.n && w.packed.size(1) == w.k / 2, op, ": w.packed is ", w.packed.shape_str(),
              " but a [", w.n, ", ", w.k, "] weight packs to [", w.n, ", ", w.k / 2, "]");
  LOCUS_CHECK(w.scales.size(0) == w.n && w.scales.size(1) == w.k / 16, op, ": w.scales is ", w.scales.shape_str(),
              " but a [", w.n, ", ", w.k, "] weight has scales [", w.n, ", ", w.k / 16, "]");
  checks::unit_last_stride(op, "w.packed", w.packed);
  checks::unit_last_stride(op, "w.scales", w.scales);
  checks::same_device(op, "w.scales", w.scales, "w.packed", w.packed);
  check_global_scale(op, w.global_scale);
}

void check_gemm_operands(const char* op, const Tensor& x, const Nvfp4Weight& w, const Tensor& bias, const Tensor& y,
                         int64_t n_out) {
  checks::rank(op, "x", x, 2);
  checks::dtype(op, "x", x, {DType::kBF16});
  LOCUS_CHECK(x.size(1) <= 1 || x.stride(1) == 1, op, ": x needs unit column stride, got strides ",
              shape_to_string(x.strides()));
  LOCUS_CHECK(w.k == x.size(1), op, ": w has K=", w.k, " but x has K=", x.size(1));
  checks::same_device(op, "w.packed", w.packed, "x", x);
  checks::rank(op, "y", y, 2);
  checks::dtype(op, "y", y, {DType::kBF16, DType::kFP32});
  LOCUS_CHECK(y.size(0) == x.size(0) && y.size(1) == n_out, op, ": y has shape ", y.shape_str(),
              " but the product is [", x.size(0), ", ", n_out, "]");
  LOCUS_CHECK(y.size(1) <= 1 || y.stride(1) == 1, op, ": y needs unit column stride, got strides ",
              shape_to_string(y.strides()));
  checks::same_device(op, "y", y, "x", x);
  checks::no_overlap(op, "y", y, "x", x);
  checks::no_overlap(op, "y", y, "w.packed", w.packed);
  checks::no_overlap(op, "y", y, "w.scales", w.scales);
  if (bias.defined()) {
    checks::rank(op, "bias", bias, 1);
    checks::dtype(op, "bias", bias, {DType::kBF16, DType::kFP32});
    checks::same_device(op, "bias", bias, "x", x);
    LOCUS_CHECK(bias.size(0) == n_out, op, ": bias has ", bias.size(0), " elements but the output has N=", n_out);
    checks::no_overlap(op, "y", y, "bias", bias);
  }
}

// True when t is a dense tensor that owns exactly its storage (not a view into a larger buffer).
bool owns_whole_storage(const Tensor& t) {
  return t.is_contiguous() && t.offset() == 0 && t.storage()->bytes == t.nbytes();
}

}  // namespace

float nvfp4_global_scale_for(const Tensor& w) {
  checks::defined("nvfp4_global_scale_for", "w", w);
  LOCUS_CHECK(w.device().is_cpu(), "nvfp4_global_scale_for: w must be a CPU tensor, got ", w.describe());
  checks::dtype("nvfp4_global_scale_for", "w", w, {DType::kBF16, DType::kFP32, DType::kFP16});
  return cpu::nvfp4_global_scale_for(w, cpu::ThreadPool::global());
}

Nvfp4Weight nvfp4_quantize(const Tensor& w) {
  check_quantize_input(w);
  return cpu::nvfp4_quantize(w, cpu::nvfp4_global_scale_for(w, cpu::ThreadPool::global()), cpu::ThreadPool::global());
}

Nvfp4Weight nvfp4_quantize(const Tensor& w, float global_scale) {
  check_quantize_input(w);
  check_global_scale("nvfp4_quantize", global_scale);
  return cpu::nvfp4_quantize(w, global_scale, cpu::ThreadPool::global());
}

Tensor nvfp4_dequantize(const Nvfp4Weight& w) {
  check_linear("nvfp4_dequantize", w);
  LOCUS_CHECK(w.packed.device().is_cpu(), "nvfp4_dequantize: the weight must be on the CPU, got ",
              w.packed.describe());
  return cpu::nvfp4_dequantize(w, cpu::ThreadPool::global());
}

Nvfp4Weight nvfp4_empty(int64_t n, int64_t k, float global_scale) {
  LOCUS_CHECK(n >= 0 && k >= 0, "nvfp4_empty: negative shape [", n, ", ", k, "]");
  Nvfp4Weight w;
  w.n = n;
  w.k = k;
  w.global_scale = global_scale;
  w.layout = Nvfp4Layout::kLinear;
  w.packed = Tensor::empty({n, k / 2}, DType::kFP4E2M1x2);
  w.scales = Tensor::empty({n, k / 16}, DType::kFP8E4M3);
  return w;
}

Nvfp4Weight nvfp4_rows(const Nvfp4Weight& w, int64_t n0, int64_t n1) {
  check_linear("nvfp4_rows", w);
  LOCUS_CHECK(0 <= n0 && n0 <= n1 && n1 <= w.n, "nvfp4_rows: rows [", n0, ", ", n1, ") out of range for a weight of ",
              w.n, " rows");
  Nvfp4Weight r = w;
  r.packed = w.packed.slice(0, n0, n1);
  r.scales = w.scales.slice(0, n0, n1);
  r.n = n1 - n0;
  return r;
}

Nvfp4Weight nvfp4_prepare(const Nvfp4Weight& w, Device device, int domain) {
  check_linear("nvfp4_prepare", w);
  LOCUS_CHECK(w.packed.device().is_cpu(), "nvfp4_prepare: the source weight must be on the CPU, got ",
              w.packed.describe());
  if (device.is_cpu()) {
    // The CPU kernel reads the linear layout. A weight that already owns its memory in the right
    // domain is returned as is; views (e.g. nvfp4_rows shards) are copied so the shard no longer
    // keeps the full weight alive.
    if (owns_whole_storage(w.packed) && owns_whole_storage(w.scales) && w.packed.domain() == domain &&
        w.scales.domain() == domain)
      return w;
    Nvfp4Weight r = w;
    r.packed = w.packed.to(Device::cpu(), domain);
    r.scales = w.scales.to(Device::cpu(), domain);
    return r;
  }
#if defined(LOCUS_WITH_CUDA)
  return cuda::nvfp4_prepare(w, device.index, domain);
#else
  LOCUS_THROW("nvfp4_prepare: target device ", device.name(), " needs the CUDA backend, which this build lacks");
#endif
}

void nvfp4_gemm(const Tensor& x, const Nvfp4Weight& w, const Tensor& bias, const Tensor& y, const Stream& stream) {
  const char* op = "nvfp4_gemm";
  check_gemm_operands(op, x, w, bias, y, w.n);
  if (x.device().is_cpu()) {
    check_linear(op, w);
    return cpu::nvfp4_gemm(x, w, bias, y, cpu::ThreadPool::from_native(stream.native));
  }
#if defined(LOCUS_WITH_CUDA)
  return cuda::nvfp4_gemm(x, w, bias, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

void nvfp4_gemm_swiglu(const Tensor& x, const Nvfp4Weight& w_gate_up, const Tensor& y, const Stream& stream) {
  const char* op = "nvfp4_gemm_swiglu";
  LOCUS_CHECK(w_gate_up.n % 2 == 0, op, ": w_gate_up must hold gate and up rows (2I), got ", w_gate_up.n, " rows");
  check_gemm_operands(op, x, w_gate_up, Tensor(), y, w_gate_up.n / 2);
  if (x.device().is_cpu()) {
    check_linear(op, w_gate_up);
    return cpu::nvfp4_gemm_swiglu(x, w_gate_up, y, cpu::ThreadPool::from_native(stream.native));
  }
#if defined(LOCUS_WITH_CUDA)
  return cuda::nvfp4_gemm_swiglu(x, w_gate_up, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
