#include "ops/nvfp4_indexed.h"

#include <cstdint>

#include "core/error.h"
#include "core/tensor_checks.h"

#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_ops.h"
#endif

namespace locus::ops {

Nvfp4WeightSet::Nvfp4WeightSet(std::vector<const Nvfp4Weight*> weights) : weights_(std::move(weights)) {
  LOCUS_CHECK(!weights_.empty(), "Nvfp4WeightSet: no weights");
  const Nvfp4Weight* w0 = weights_[0];
  for (size_t i = 0; i < weights_.size(); ++i) {
    const Nvfp4Weight* w = weights_[i];
    LOCUS_CHECK(w != nullptr, "Nvfp4WeightSet: weight ", i, " is null");
    LOCUS_CHECK(w->n == w0->n && w->k == w0->k && w->layout == w0->layout &&
                    w->packed.device() == w0->packed.device(),
                "Nvfp4WeightSet: weight ", i, " is ", w->n, " x ", w->k, " on ", w->packed.device().name(),
                " but weight 0 is ", w0->n, " x ", w0->k, " on ", w0->packed.device().name(),
                " (one shape, layout and device)");
  }
}

Tensor Nvfp4WeightSet::device_table() const {
#if defined(LOCUS_WITH_CUDA)
  std::vector<const void*> now;
  for (const Nvfp4Weight* w : weights_) {
    now.push_back(w->packed.data_ptr());
    now.push_back(w->scales.data_ptr());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!table_.defined() || now != table_of_) {
    table_ = cuda::nvfp4_weight_table(weights_);
    table_of_ = std::move(now);
  }
  return table_;
#else
  LOCUS_THROW("Nvfp4WeightSet: this build has no CUDA backend");
#endif
}

namespace {

// The operand checks of one product (nvfp4_gemm_indexed's contract); false when it is empty.
bool check_product(const Nvfp4IndexedProduct& pr, bool swiglu) {
  const char* op = "nvfp4_gemm_indexed";
  const Tensor &x = pr.x, &ids = pr.ids, &y = pr.y;
  LOCUS_CHECK(pr.set != nullptr, op, ": a product has no weight set");
  checks::rank(op, "x", x, 2);
  checks::rank(op, "ids", ids, 2);
  checks::rank(op, "y", y, 2);
  checks::dtype(op, "x", x, {DType::kBF16});
  checks::dtype(op, "ids", ids, {DType::kI32});
  checks::dtype(op, "y", y, {DType::kBF16, DType::kFP32});
  const int64_t T = x.size(0), k = ids.size(1);
  const Nvfp4Weight& w0 = *pr.set->weights()[0];
  const int64_t N = swiglu ? w0.n / 2 : w0.n;
  LOCUS_CHECK(!swiglu || w0.n % 2 == 0, op, ": a fused gate/up weight needs an even row count, got ", w0.n);
  checks::size(op, "ids", ids, 0, T, "rows (tokens)");
  checks::size(op, "x", x, 1, w0.k, "columns (K)");
  checks::size(op, "y", y, 0, T * k, "rows (tokens x choices)");
  checks::size(op, "y", y, 1, N, "columns");
  checks::same_device(op, "ids", ids, "x", x);
  checks::same_device(op, "y", y, "x", x);
  LOCUS_CHECK(w0.packed.device() == x.device(), op, ": the weights are on ", w0.packed.device().name(),
              ", x on ", x.device().name());
  LOCUS_CHECK(ids.stride(1) == 1 && ids.stride(0) == k, op, ": ids must be contiguous, got strides ",
              shape_to_string(ids.strides()));
  checks::no_overlap(op, "y", y, "x", x);
  return T > 0 && k > 0;
}

// One product on the CPU: the calls nvfp4_gemm(_swiglu) makes for each row, in row order.
void run_product_cpu(const Nvfp4IndexedProduct& pr, bool swiglu, const Stream& stream) {
  const int64_t T = pr.x.size(0), k = pr.ids.size(1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = pr.ids.data<int32_t>()[t * k + j];
      LOCUS_CHECK(e >= 0 && e < pr.set->size(), "nvfp4_gemm_indexed: id ", e, " of token ", t, " choice ", j,
                  " is outside [0, ", pr.set->size(), ")");
      const Nvfp4Weight& w = *pr.set->weights()[static_cast<size_t>(e)];
      const Tensor xs = pr.x.slice(0, t, t + 1), ys = pr.y.slice(0, t * k + j, t * k + j + 1);
      swiglu ? nvfp4_gemm_swiglu(xs, w, ys, stream) : nvfp4_gemm(xs, w, Tensor(), ys, stream);
    }
  }
}

}  // namespace

void nvfp4_gemm_indexed(const Tensor& x, const Tensor& ids, const Nvfp4WeightSet& set, const Tensor& y, bool swiglu,
                        const Stream& stream) {
  nvfp4_gemm_indexed({Nvfp4IndexedProduct{x, ids, &set, y}}, swiglu, stream);
}

void nvfp4_gemm_indexed(const std::vector<Nvfp4IndexedProduct>& products, bool swiglu, const Stream& stream) {
  const char* op = "nvfp4_gemm_indexed";
  std::vector<Nvfp4IndexedProduct> work;
  for (const Nvfp4IndexedProduct& pr : products)
    if (check_product(pr, swiglu)) work.push_back(pr);
  if (work.empty()) return;
  const Nvfp4IndexedProduct& first = work[0];
  const Nvfp4Weight& w0 = *first.set->weights()[0];
  for (const Nvfp4IndexedProduct& pr : work) {
    const Nvfp4Weight& w = *pr.set->weights()[0];
    LOCUS_CHECK(w.n == w0.n && w.k == w0.k && w.layout == w0.layout, op, ": products' weights are ", w.n, " x ", w.k,
                " and ", w0.n, " x ", w0.k, " (one launch takes one shape)");
    checks::same_device(op, "x", pr.x, "the first product's x", first.x);
    checks::dtype(op, "y", pr.y, {first.y.dtype()});
    LOCUS_CHECK(reinterpret_cast<uintptr_t>(pr.y.data_ptr()) >= reinterpret_cast<uintptr_t>(first.y.data_ptr()), op,
                ": a product's y starts before the first product's");
  }
  if (first.x.device().is_cpu()) {
    for (const Nvfp4IndexedProduct& pr : work) run_product_cpu(pr, swiglu, stream);
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::nvfp4_gemm_indexed(work, swiglu, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", first.x.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
