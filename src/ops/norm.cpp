// Dispatch and validation for RMSNorm and the element-wise helpers (ops/norm.h).
#include "ops/norm.h"

#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_small_ops.h"
#endif

namespace locus::ops {
namespace {

void check_same_shape(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  LOCUS_CHECK(t.shape() == ref.shape(), op, ": ", name, " has shape ", t.shape_str(), " but ", ref_name, " has ",
              ref.shape_str());
}

// y may be exactly a (same view) but must not partially overlap any input.
void check_alias(const char* op, const Tensor& y, const char* name, const Tensor& in, bool exact_alias_ok) {
  if (!checks::may_overlap(y, in)) return;
  const bool same_view = y.data_ptr() == in.data_ptr() && y.strides() == in.strides() && y.dtype() == in.dtype();
  LOCUS_CHECK(exact_alias_ok && same_view, op, ": output y overlaps input ", name,
              exact_alias_ok ? " without being the same view" : "");
}

constexpr std::initializer_list<DType> kFloatTypes = {DType::kBF16, DType::kFP32, DType::kFP16};

// rmsnorm's operands (aliasing of y and x apart).
void check_rmsnorm(const char* op, const Tensor& x, const Tensor& weight, float eps, const Tensor& y) {
  checks::defined(op, "x", x);
  checks::defined(op, "y", y);
  LOCUS_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  checks::dtype(op, "x", x, {DType::kBF16, DType::kFP32});
  checks::dtype(op, "y", y, {DType::kBF16, DType::kFP32});
  checks::rank(op, "weight", weight, 1);
  checks::dtype(op, "weight", weight, {DType::kBF16, DType::kFP32});
  LOCUS_CHECK(weight.size(0) == x.size(-1), op, ": weight has ", weight.size(0), " elements but x has H=", x.size(-1));
  check_same_shape(op, "y", y, "x", x);
  checks::unit_last_stride(op, "x", x);
  checks::unit_last_stride(op, "y", y);
  checks::same_device(op, "weight", weight, "x", x);
  checks::same_device(op, "y", y, "x", x);
  LOCUS_CHECK(std::isfinite(eps) && eps >= 0.f, op, ": eps must be finite and >= 0, got ", eps);
  check_alias(op, y, "weight", weight, false);
}

}  // namespace

void rmsnorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Stream& stream) {
  const char* op = "rmsnorm";
  check_rmsnorm(op, x, weight, eps, y);
  check_alias(op, y, "x", x, true);
  if (x.device().is_cpu()) return cpu::rmsnorm(x, weight, eps, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  cuda::rmsnorm(x, weight, eps, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

void add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& weight, float eps, const Tensor& y,
                 const Stream& stream) {
  const char* op = "add_rmsnorm";
  check_rmsnorm(op, x, weight, eps, y);
  checks::defined(op, "r", r);
  LOCUS_CHECK(r.dtype() == x.dtype(), op, ": r must have x's dtype ", dtype_name(x.dtype()), ", got ", r.describe());
  check_same_shape(op, "r", r, "x", x);
  checks::unit_last_stride(op, "r", r);
  checks::same_device(op, "r", r, "x", x);
  check_alias(op, y, "x", x, false);
  check_alias(op, y, "r", r, false);
  LOCUS_CHECK(!checks::may_overlap(x, r), op, ": x (updated in place) overlaps r");
  if (x.device().is_cpu()) {
    cpu::ThreadPool& pool = cpu::ThreadPool::from_native(stream.native);
    cpu::add(x, r, x, pool);
    return cpu::rmsnorm(x, weight, eps, y, pool);
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::add_rmsnorm(x, r, weight, eps, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

void add(const Tensor& a, const Tensor& b, const Tensor& y, const Stream& stream) {
  const char* op = "add";
  checks::dtype(op, "a", a, {DType::kBF16, DType::kFP32});
  checks::dtype(op, "b", b, {DType::kBF16, DType::kFP32});
  checks::dtype(op, "y", y, {DType::kBF16, DType::kFP32});
  check_same_shape(op, "b", b, "a", a);
  check_same_shape(op, "y", y, "a", a);
  checks::same_device(op, "b", b, "a", a);
  checks::same_device(op, "y", y, "a", a);
  check_alias(op, y, "a", a, true);
  check_alias(op, y, "b", b, true);
  if (a.device().is_cpu()) return cpu::add(a, b, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  cuda::add(a, b, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", a.device().name(), " but this build has no CUDA backend");
#endif
}

void cast(const Tensor& x, const Tensor& y, const Stream& stream) {
  const char* op = "cast";
  checks::dtype(op, "x", x, kFloatTypes);
  checks::dtype(op, "y", y, kFloatTypes);
  check_same_shape(op, "y", y, "x", x);
  checks::same_device(op, "y", y, "x", x);
  check_alias(op, y, "x", x, false);
  if (x.device().is_cpu()) return cpu::cast(x, y, cpu::ThreadPool::from_native(stream.native));
#if defined(LOCUS_WITH_CUDA)
  cuda::cast(x, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

void embedding(const Tensor& table, const Tensor& ids, const Tensor& y, const Stream& stream) {
  const char* op = "embedding";
  checks::rank(op, "table", table, 2);
  checks::dtype(op, "table", table, kFloatTypes);
  checks::rank(op, "ids", ids, 1);
  checks::dtype(op, "ids", ids, {DType::kI32, DType::kI64});
  checks::rank(op, "y", y, 2);
  checks::dtype(op, "y", y, kFloatTypes);
  LOCUS_CHECK(y.size(0) == ids.size(0) && y.size(1) == table.size(1), op, ": y has shape ", y.shape_str(),
              " but ", ids.size(0), " ids of a table with H=", table.size(1), " give [", ids.size(0), ", ",
              table.size(1), "]");
  checks::unit_last_stride(op, "table", table);
  checks::unit_last_stride(op, "y", y);
  checks::same_device(op, "ids", ids, "table", table);
  checks::same_device(op, "y", y, "table", table);
  check_alias(op, y, "table", table, false);
  if (table.device().is_cpu()) {
    for (int64_t t = 0; t < ids.size(0); ++t) {
      const int64_t id = cpu::load_index(ids, t);
      LOCUS_CHECK(id >= 0 && id < table.size(0), op, ": ids[", t, "] = ", id, " is out of range for a table of ",
                  table.size(0), " rows");
    }
    return cpu::embedding(table, ids, y, cpu::ThreadPool::from_native(stream.native));
  }
  // Device ids are not read back (that would synchronize every call): the kernel writes a NaN
  // row for an id out of range.
#if defined(LOCUS_WITH_CUDA)
  cuda::embedding(table, ids, y, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", table.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
