// Dispatch and validation for softmax and top-k (ops/softmax_topk.h).
#include "ops/softmax_topk.h"

#include "backends/cpu/cpu_ops.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_small_ops.h"
#endif

namespace locus::ops {

void softmax(const Tensor& x, const Tensor& y, const Stream& stream) {
  const char* op = "softmax";
  checks::dtype(op, "x", x, {DType::kFP32});
  checks::dtype(op, "y", y, {DType::kFP32});
  LOCUS_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  LOCUS_CHECK(y.shape() == x.shape(), op, ": y has shape ", y.shape_str(), " but x has ", x.shape_str());
  checks::unit_last_stride(op, "x", x);
  checks::unit_last_stride(op, "y", y);
  checks::same_device(op, "y", y, "x", x);
  if (checks::may_overlap(y, x))
    LOCUS_CHECK(y.data_ptr() == x.data_ptr() && y.strides() == x.strides(), op,
                ": y overlaps x without being the same view");
  if (x.device().is_cpu()) return cpu::softmax(x, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  cuda::softmax(x, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices, const Stream& stream) {
  const char* op = "topk";
  checks::dtype(op, "x", x, {DType::kFP32, DType::kBF16});
  checks::dtype(op, "values", values, {DType::kFP32, DType::kBF16});
  checks::dtype(op, "indices", indices, {DType::kI32, DType::kI64});
  LOCUS_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  const int64_t n = x.size(-1);
  LOCUS_CHECK(k >= 0 && k <= n, op, ": k=", k, " is outside [0, ", n, "] for rows of ", n, " values");
  Shape want = x.shape();
  want.back() = k;
  LOCUS_CHECK(values.shape() == want, op, ": values has shape ", values.shape_str(), " but ", shape_to_string(want),
              " is required");
  LOCUS_CHECK(indices.shape() == want, op, ": indices has shape ", indices.shape_str(), " but ",
              shape_to_string(want), " is required");
  checks::unit_last_stride(op, "x", x);
  checks::same_device(op, "values", values, "x", x);
  checks::same_device(op, "indices", indices, "x", x);
  checks::no_overlap(op, "values", values, "x", x);
  checks::no_overlap(op, "indices", indices, "x", x);
  checks::no_overlap(op, "indices", indices, "values", values);
  if (x.device().is_cpu()) return cpu::topk(x, k, values, indices, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  cuda::topk(x, k, values, indices, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
