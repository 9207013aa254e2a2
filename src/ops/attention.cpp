// ops::mla_attention: operand validation and backend dispatch.
#include "ops/attention.h"

#include "backends/cpu/attention.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_attention.h"
#endif

namespace locus::ops {
namespace {

void check_operand(const char* name, const Tensor& t, int64_t rows, int64_t heads, int64_t dim, bool may_share_head,
                   const Tensor& ref) {
  const char* op = "mla_attention";
  checks::rank(op, name, t, 3);
  checks::dtype(op, name, t, {DType::kBF16, DType::kFP32});
  checks::same_device(op, name, t, "q_a", ref);
  checks::unit_last_stride(op, name, t);
  if (rows >= 0) checks::size(op, name, t, 0, rows, "rows");
  const int64_t h = t.size(1);
  LOCUS_CHECK(h == heads || (may_share_head && h == 1), op, ": ", name, " has ", h, " heads but ", heads,
              may_share_head ? " (or 1, shared by all query heads)" : "", " are required (", name, " is ",
              t.describe(), ")");
  checks::size(op, name, t, 2, dim, "head dim");
}

// mla_attention's operand checks; T and S are q_a's and k_a's rows.
void check_attention(const char* op, const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b,
                     const Tensor& v, const Tensor& out, int64_t q_start) {
  checks::rank(op, "q_a", q_a, 3);
  const int64_t T = q_a.size(0), H = q_a.size(1), Da = q_a.size(2);
  checks::rank(op, "q_b", q_b, 3);
  checks::rank(op, "k_a", k_a, 3);
  checks::rank(op, "v", v, 3);
  const int64_t Db = q_b.size(2), S = k_a.size(0), Dv = v.size(2);
  check_operand("q_a", q_a, T, H, Da, false, q_a);
  check_operand("q_b", q_b, T, H, Db, false, q_a);
  check_operand("k_a", k_a, S, H, Da, true, q_a);
  check_operand("k_b", k_b, S, H, Db, true, q_a);
  check_operand("v", v, S, H, Dv, true, q_a);
  check_operand("out", out, T, H, Dv, false, q_a);
  LOCUS_CHECK(q_start >= 0, op, ": q_start must be >= 0, got ", q_start);
  LOCUS_CHECK(S >= q_start + T, op, ": ", S, " keys cannot hold q_start ", q_start, " + ", T,
              " query tokens (causal attention needs S >= q_start + T)");
  for (const Tensor* in : {&q_a, &q_b, &k_a, &k_b, &v}) checks::no_overlap(op, "out", out, "an input", *in);
}

}  // namespace

void mla_attention(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b, const Tensor& v,
                   const Tensor& out, float scale, int64_t q_start, const Stream& stream) {
  const char* op = "mla_attention";
  check_attention(op, q_a, q_b, k_a, k_b, v, out, q_start);
  if (q_a.size(0) == 0) return;
  if (q_a.device().is_cpu()) {
    cpu::mla_attention(q_a, q_b, k_a, k_b, v, out, scale, q_start, cpu::ThreadPool::from_native(stream.native));
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::mla_attention(q_a, q_b, k_a, k_b, v, out, scale, q_start, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", q_a.device().name(), " but this build has no CUDA backend");
#endif
}

void mla_attention_batch(const Tensor& q_a, const Tensor& q_b, const std::vector<AttentionKeys>& keys,
                         const Tensor& out, float scale, const Stream& stream) {
  const char* op = "mla_attention_batch";
  LOCUS_CHECK(!keys.empty(), op, ": no sequences");
  checks::rank(op, "q_a", q_a, 3);
  const int64_t B = static_cast<int64_t>(keys.size()), rows = q_a.size(0);
  LOCUS_CHECK(rows % B == 0, op, ": ", rows, " query rows do not split evenly over ", B, " sequences");
  const int64_t T = rows / B;
  checks::rank(op, "q_b", q_b, 3);
  checks::rank(op, "out", out, 3);
  checks::size(op, "q_b", q_b, 0, rows, "rows");
  checks::size(op, "out", out, 0, rows, "rows");
  for (int64_t i = 0; i < B; ++i) {
    const AttentionKeys& k = keys[static_cast<size_t>(i)];
    LOCUS_CHECK(k.k_a.defined() && k.k_b.defined() && k.v.defined() && k.k_a.dim() == 3, op, ": sequence ", i,
                "'s keys are missing or not [S, heads, dim]");
    LOCUS_CHECK(k.k_a.size(0) >= T, op, ": sequence ", i, " has ", k.k_a.size(0), " keys, fewer than its ", T,
                " query rows (its queries are its last keys)");
    check_attention(op, q_a.slice(0, i * T, (i + 1) * T), q_b.slice(0, i * T, (i + 1) * T), k.k_a, k.k_b, k.v,
                    out.slice(0, i * T, (i + 1) * T), k.k_a.size(0) - T);
  }
  if (T == 0) return;
  if (q_a.device().is_cpu()) {
    for (int64_t i = 0; i < B; ++i) {
      const AttentionKeys& k = keys[static_cast<size_t>(i)];
      cpu::mla_attention(q_a.slice(0, i * T, (i + 1) * T), q_b.slice(0, i * T, (i + 1) * T), k.k_a, k.k_b, k.v,
                         out.slice(0, i * T, (i + 1) * T), scale, k.k_a.size(0) - T,
                         cpu::ThreadPool::from_native(stream.native));
    }
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::mla_attention_batch(q_a, q_b, keys, out, scale, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", q_a.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
