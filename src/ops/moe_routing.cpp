// ops/moe_routing.h entry points: validation and backend dispatch.
#include "ops/moe_routing.h"

#include <limits>

#include "backends/cpu/moe_routing.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_moe_ops.h"
#endif

namespace locus::ops {
namespace {

#if !defined(LOCUS_WITH_CUDA)
[[noreturn]] void no_cuda_backend(const char* op, const Tensor& t) {
  LOCUS_THROW(op, ": tensors are on ", t.device().name(), " but this build has no CUDA backend");
}
#endif

void row_major(const char* op, const char* name, const Tensor& t) {
  LOCUS_CHECK(t.dim() == 2 && t.stride(1) == 1, op, ": ", name, " must be a row-major 2-D tensor, got ",
              t.describe(), " with strides ", shape_to_string(t.strides()));
}

// moe_route's operand checks (shared with moe_route_forced).
void check_route(const char* op, const Tensor& logits, const Tensor& correction_bias, const MoeRoutingConfig& cfg,
                 const Tensor& weights, const Tensor& ids) {
  const int64_t E = cfg.num_experts;
  LOCUS_CHECK(E >= 1, op, ": num_experts must be positive, got ", E);
  LOCUS_CHECK(cfg.n_group >= 1 && E % cfg.n_group == 0, op, ": n_group=", cfg.n_group,
              " must be positive and divide num_experts=", E);
  LOCUS_CHECK(cfg.topk_group >= 1 && cfg.topk_group <= cfg.n_group, op, ": topk_group=", cfg.topk_group,
              " must be in [1, n_group=", cfg.n_group, "]");
  const int64_t selectable = cfg.n_group > 1 && cfg.topk_group < cfg.n_group ? cfg.topk_group * (E / cfg.n_group) : E;
  LOCUS_CHECK(cfg.top_k >= 1 && cfg.top_k <= selectable, op, ": top_k=", cfg.top_k, " must be in [1, ", selectable,
              "] (experts in the topk_group=", cfg.topk_group, " kept groups)");
  checks::rank(op, "logits", logits, 2);
  checks::dtype(op, "logits", logits, {DType::kFP32});
  row_major(op, "logits", logits);
  checks::size(op, "logits", logits, 1, E, "experts");
  const int64_t T = logits.size(0);
  if (correction_bias.defined()) {
    checks::rank(op, "correction_bias", correction_bias, 1);
    checks::dtype(op, "correction_bias", correction_bias, {DType::kFP32});
    checks::size(op, "correction_bias", correction_bias, 0, E, "experts");
    checks::same_device(op, "correction_bias", correction_bias, "logits", logits);
  }
  checks::rank(op, "weights", weights, 2);
  checks::dtype(op, "weights", weights, {DType::kFP32});
  row_major(op, "weights", weights);
  checks::size(op, "weights", weights, 0, T, "rows");
  checks::size(op, "weights", weights, 1, cfg.top_k, "columns (top_k)");
  checks::rank(op, "ids", ids, 2);
  checks::dtype(op, "ids", ids, {DType::kI32});
  row_major(op, "ids", ids);
  checks::size(op, "ids", ids, 0, T, "rows");
  checks::size(op, "ids", ids, 1, cfg.top_k, "columns (top_k)");
  checks::same_device(op, "weights", weights, "logits", logits);
  checks::same_device(op, "ids", ids, "logits", logits);
}

}  // namespace

void moe_route(const Tensor& logits, const Tensor& correction_bias, const MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, const Stream& stream) {
  const char* op = "moe_route";
  check_route(op, logits, correction_bias, cfg, weights, ids);
  if (logits.size(0) == 0) return;
  if (logits.device().is_cpu()) {
    return cpu::moe_route(logits, correction_bias, cfg, weights, ids, cpu::ThreadPool::from_native(stream.native));
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::moe_route(logits, correction_bias, cfg, weights, ids, stream.native);
#else
  no_cuda_backend(op, logits);
#endif
}

void moe_route_forced(const Tensor& logits, const MoeRoutingConfig& cfg, const Tensor& forced_ids,
                      const Tensor& weights, const Tensor& ids, const Stream& stream) {
  const char* op = "moe_route_forced";
  check_route(op, logits, Tensor(), cfg, weights, ids);
  checks::dtype(op, "forced_ids", forced_ids, {DType::kI32});
  row_major(op, "forced_ids", forced_ids);
  checks::size(op, "forced_ids", forced_ids, 0, logits.size(0), "rows");
  checks::size(op, "forced_ids", forced_ids, 1, cfg.top_k, "columns (top_k)");
  LOCUS_CHECK(logits.device().is_cpu() && forced_ids.device().is_cpu(), op,
              ": runs on the CPU backend only, got logits on ", logits.device().name(), " and forced_ids on ",
              forced_ids.device().name());
  if (logits.size(0) == 0) return;
  cpu::moe_route(logits, Tensor(), cfg, weights, ids, cpu::ThreadPool::from_native(stream.native), forced_ids);
}

void moe_group(const Tensor& ids, int64_t num_experts, const Tensor& offsets, const Tensor& rows, const Tensor& slot,
               const Stream& stream) {
  const char* op = "moe_group";
  const int64_t E = num_experts;
  LOCUS_CHECK(E >= 1, op, ": num_experts must be positive, got ", E);
  checks::rank(op, "ids", ids, 2);
  checks::dtype(op, "ids", ids, {DType::kI32});
  row_major(op, "ids", ids);
  const int64_t T = ids.size(0), K = ids.size(1), R = T * K;
  LOCUS_CHECK(R <= std::numeric_limits<int32_t>::max() && E < std::numeric_limits<int32_t>::max(), op,
              ": T * k = ", R, " pairs and num_experts = ", E, " must fit in int32 rows and offsets");
  checks::rank(op, "offsets", offsets, 1);
  checks::dtype(op, "offsets", offsets, {DType::kI32});
  checks::size(op, "offsets", offsets, 0, E + 1, "elements (num_experts + 1)");
  checks::unit_last_stride(op, "offsets", offsets);
  checks::rank(op, "rows", rows, 1);
  checks::dtype(op, "rows", rows, {DType::kI32});
  checks::size(op, "rows", rows, 0, R, "elements (T * k)");
  checks::unit_last_stride(op, "rows", rows);
  checks::rank(op, "slot", slot, 2);
  checks::dtype(op, "slot", slot, {DType::kI32});
  row_major(op, "slot", slot);
  checks::size(op, "slot", slot, 0, T, "rows");
  checks::size(op, "slot", slot, 1, K, "columns (top_k)");
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"offsets", &offsets}, {"rows", &rows}, {"slot", &slot}}) {
    checks::same_device(op, name, *t, "ids", ids);
    checks::no_overlap(op, name, *t, "ids", ids);
  }
  checks::no_overlap(op, "rows", rows, "offsets", offsets);
  checks::no_overlap(op, "slot", slot, "offsets", offsets);
  checks::no_overlap(op, "slot", slot, "rows", rows);
  if (ids.device().is_cpu()) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids.data<int32_t>()[t * ids.stride(0) + j];
        LOCUS_CHECK(e >= 0 && e < E, op, ": ids[", t, ", ", j, "]=", e, " is out of range for num_experts=", E);
      }
    return cpu::moe_group(ids, E, offsets, rows, slot);
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::moe_group(ids, E, offsets, rows, slot, stream.native);
#else
  no_cuda_backend(op, ids);
#endif
}

namespace {

const Tensor& checked_offsets(const Tensor& offsets) {
  checks::rank("moe_offsets_to_host", "offsets", offsets, 1);
  checks::dtype("moe_offsets_to_host", "offsets", offsets, {DType::kI32});
  return offsets;
}

}  // namespace

MoeOffsetsReadback::MoeOffsetsReadback(const Tensor& offsets, const Stream& stream)
    : copy_(checked_offsets(offsets), stream) {}

std::vector<int64_t> MoeOffsetsReadback::wait() {
  const Tensor host = copy_.wait();
  std::vector<int64_t> out(static_cast<size_t>(host.size(0)));
  for (int64_t e = 0; e < host.size(0); ++e) out[static_cast<size_t>(e)] = host.data<int32_t>()[e];
  return out;
}

std::vector<int64_t> moe_offsets_to_host(const Tensor& offsets, const Stream& stream) {
  return MoeOffsetsReadback(offsets, stream).wait();
}

void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, const Stream& stream) {
  const char* op = "moe_gather";
  checks::rank(op, "x", x, 2);
  row_major(op, "x", x);
  checks::rank(op, "rows", rows, 1);
  checks::dtype(op, "rows", rows, {DType::kI32});
  checks::rank(op, "y", y, 2);
  row_major(op, "y", y);
  LOCUS_CHECK(y.dtype() == x.dtype(), op, ": y ", y.describe(), " must have x's dtype ", dtype_name(x.dtype()));
  checks::size(op, "y", y, 0, rows.size(0), "rows");
  checks::size(op, "y", y, 1, x.size(1), "columns");
  checks::same_device(op, "rows", rows, "x", x);
  checks::same_device(op, "y", y, "x", x);
  checks::no_overlap(op, "y", y, "x", x);
  if (rows.size(0) == 0) return;
  if (x.device().is_cpu()) {
    for (int64_t i = 0; i < rows.size(0); ++i) {
      const int32_t r = rows.data<int32_t>()[i * rows.stride(0)];
      LOCUS_CHECK(r >= 0 && r < x.size(0), op, ": rows[", i, "]=", r, " is out of range for x with ", x.size(0), " rows");
    }
    return cpu::moe_gather(x, rows, y, cpu::ThreadPool::from_native(stream.native));
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::moe_gather(x, rows, y, stream.native);  // rows are device values: out-of-range rows give zero rows
#else
  no_cuda_backend(op, x);
#endif
}

void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, const Stream& stream) {
  const char* op = "moe_combine";
  checks::rank(op, "expert_out", expert_out, 2);
  checks::dtype(op, "expert_out", expert_out, {DType::kBF16, DType::kFP32});
  row_major(op, "expert_out", expert_out);
  checks::rank(op, "y", y, 2);
  checks::dtype(op, "y", y, {DType::kBF16, DType::kFP32});
  row_major(op, "y", y);
  const int64_t T = y.size(0), H = y.size(1);
  checks::size(op, "expert_out", expert_out, 1, H, "columns");
  checks::rank(op, "slot", slot, 2);
  checks::dtype(op, "slot", slot, {DType::kI32});
  checks::size(op, "slot", slot, 0, T, "rows");
  checks::rank(op, "weights", weights, 2);
  checks::dtype(op, "weights", weights, {DType::kFP32});
  checks::size(op, "weights", weights, 0, T, "rows");
  checks::size(op, "weights", weights, 1, slot.size(1), "columns (top_k)");
  if (shared.defined()) {
    checks::rank(op, "shared", shared, 2);
    checks::dtype(op, "shared", shared, {DType::kBF16, DType::kFP32});
    row_major(op, "shared", shared);
    checks::size(op, "shared", shared, 0, T, "rows");
    checks::size(op, "shared", shared, 1, H, "columns");
    checks::same_device(op, "shared", shared, "y", y);
  }
  for (const Tensor* t : {&expert_out, &slot, &weights}) checks::same_device(op, "an input", *t, "y", y);
  checks::no_overlap(op, "y", y, "expert_out", expert_out);
  if (T == 0) return;
  if (y.device().is_cpu()) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < slot.size(1); ++j) {
        const int32_t r = slot.data<int32_t>()[t * slot.stride(0) + j * slot.stride(1)];
        LOCUS_CHECK(r >= -1 && r < expert_out.size(0), op, ": slot[", t, ", ", j, "]=", r,
                    " is out of range for expert_out with ", expert_out.size(0), " rows");
      }
    }
    return cpu::moe_combine(expert_out, slot, weights, shared, y, cpu::ThreadPool::from_native(stream.native));
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::moe_combine(expert_out, slot, weights, shared, y, stream.native);  // device slots out of range are skipped
#else
  no_cuda_backend(op, y);
#endif
}

}  // namespace locus::ops
