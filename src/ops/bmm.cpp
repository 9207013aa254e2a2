// Dispatch and validation for the batched product (ops/bmm.h).
#include "ops/bmm.h"

#include "backends/cpu/cpu_ops.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_ops.h"
#endif

namespace locus::ops {

void bmm(const Tensor& a, const Tensor& b, const Tensor& y, const Stream& stream) {
  const char* op = "bmm";
  checks::rank(op, "a", a, 3);
  checks::rank(op, "b", b, 3);
  checks::rank(op, "y", y, 3);
  checks::dtype(op, "a", a, {DType::kBF16});
  checks::dtype(op, "b", b, {DType::kBF16});
  checks::dtype(op, "y", y, {DType::kBF16, DType::kFP32});
  const int64_t batches = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  LOCUS_CHECK(b.size(0) == batches, op, ": b has B=", b.size(0), " but a has B=", batches);
  LOCUS_CHECK(b.size(1) == k, op, ": b has K=", b.size(1), " but a has K=", k);
  LOCUS_CHECK(y.size(0) == batches && y.size(1) == m && y.size(2) == n, op, ": y has shape ", y.shape_str(),
              " but the product is [", batches, ", ", m, ", ", n, "]");
  LOCUS_CHECK(k <= 1 || a.stride(2) == 1, op, ": a needs unit stride along K, got strides ",
              shape_to_string(a.strides()));
  LOCUS_CHECK(n <= 1 || k <= 1 || b.stride(2) == 1 || b.stride(1) == 1, op,
              ": b must be row-major [K, N] (stride(2) == 1) or a transposed [N, K] view (stride(1) == 1), got strides ",
              shape_to_string(b.strides()));
  LOCUS_CHECK(n <= 1 || y.stride(2) == 1, op, ": y needs unit stride along N, got strides ",
              shape_to_string(y.strides()));
  checks::same_device(op, "b", b, "a", a);
  checks::same_device(op, "y", y, "a", a);
  checks::no_overlap(op, "y", y, "a", a);
  checks::no_overlap(op, "y", y, "b", b);
  if (a.device().is_cpu()) return cpu::bmm(a, b, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  return cuda::bmm(a, b, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", a.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
