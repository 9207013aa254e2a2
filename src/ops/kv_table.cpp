// ops::kv_append_rows and ops::mla_attention_table: validation and backend dispatch; the CPU
// form reads the table on the host and runs the direct ops over views of each cache.
#include "ops/kv_table.h"

#include "backends/cpu/attention.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_kv_table.h"
#endif

namespace locus::ops {
namespace {

// The table's own checks, against `ref` (an operand with one row per sequence). Returns B.
int64_t check_table(const char* op, const KvTable& t, const Tensor& ref) {
  checks::defined(op, "table.rows", t.rows);
  checks::defined(op, "table.lengths", t.lengths);
  checks::rank(op, "table.rows", t.rows, 1);
  checks::rank(op, "table.lengths", t.lengths, 1);
  checks::dtype(op, "table.rows", t.rows, {DType::kI64});
  checks::dtype(op, "table.lengths", t.lengths, {DType::kI32});
  checks::same_device(op, "table.rows", t.rows, "the operands", ref);
  checks::same_device(op, "table.lengths", t.lengths, "the operands", ref);
  LOCUS_CHECK(t.rows.is_contiguous() && t.lengths.is_contiguous(), op, ": the table's rows and lengths must be contiguous");
  const int64_t B = t.rows.size(0);
  checks::size(op, "table.lengths", t.lengths, 0, B, "sequences");
  LOCUS_CHECK(t.width >= 1 && t.max_keys >= 1, op, ": table width and max_keys must be positive, got ", t.width, " and ",
              t.max_keys);
  return B;
}

// Sequence b's cache rows [0, n) as a host view (CPU form).
Tensor host_cache(const KvTable& t, int64_t b, int64_t n) {
  void* base = reinterpret_cast<void*>(static_cast<intptr_t>(t.rows.data<int64_t>()[b]));
  return Tensor::from_blob(base, {n, t.width}, DType::kBF16);
}

// lengths[b] on the host, checked against the table's bound (CPU form).
int64_t host_length(const char* op, const KvTable& t, int64_t b) {
  const int64_t len = t.lengths.data<int32_t>()[b];
  LOCUS_CHECK(len >= 0 && len + 1 <= t.max_keys, op, ": sequence ", b, " holds ", len,
              " tokens, outside the table's bound of ", t.max_keys, " keys with the new one");
  return len;
}

}  // namespace

void kv_lengths_advance(const Tensor& lengths, const Stream& stream) {
  const char* op = "kv_lengths_advance";
  checks::defined(op, "lengths", lengths);
  checks::rank(op, "lengths", lengths, 1);
  checks::dtype(op, "lengths", lengths, {DType::kI32});
  LOCUS_CHECK(lengths.is_contiguous(), op, ": lengths must be contiguous");
  if (lengths.numel() == 0) return;
  if (lengths.device().is_cpu()) {
    int32_t* l = lengths.data<int32_t>();
    for (int64_t b = 0; b < lengths.numel(); ++b) ++l[b];
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::kv_lengths_advance(lengths, stream.native);
#else
  LOCUS_THROW(op, ": lengths are on ", lengths.device().name(), " but this build has no CUDA backend");
#endif
}

void kv_append_rows(const Tensor& src, const KvTable& table, const Stream& stream) {
  const char* op = "kv_append_rows";
  checks::rank(op, "src", src, 2);
  checks::dtype(op, "src", src, {DType::kBF16});
  checks::unit_last_stride(op, "src", src);
  const int64_t B = check_table(op, table, src);
  checks::size(op, "src", src, 0, B, "sequences");
  checks::size(op, "src", src, 1, table.width, "table width");
  if (B == 0) return;
  if (src.device().is_cpu()) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = host_length(op, table, b);
      host_cache(table, b, len + 1).slice(0, len, len + 1).copy_(src.slice(0, b, b + 1));
    }
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::kv_append_rows(src, table, stream.native);
#else
  (void)stream;
  LOCUS_THROW(op, ": tensors are on ", src.device().name(), " but this build has no CUDA backend");
#endif
}

void mla_attention_table(const Tensor& q_a, const Tensor& q_b, const KvTable& table, const Tensor& out, float scale,
                         const Stream& stream) {
  const char* op = "mla_attention_table";
  checks::rank(op, "q_a", q_a, 3);
  checks::rank(op, "q_b", q_b, 3);
  checks::rank(op, "out", out, 3);
  checks::dtype(op, "q_a", q_a, {DType::kBF16});
  checks::dtype(op, "q_b", q_b, {DType::kBF16});
  checks::dtype(op, "out", out, {DType::kBF16, DType::kFP32});
  const int64_t B = check_table(op, table, q_a), H = q_a.size(1), Da = q_a.size(2);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"q_b", &q_b}, {"out", &out}}) {
    checks::same_device(op, name, *t, "q_a", q_a);
    checks::unit_last_stride(op, name, *t);
    checks::size(op, name, *t, 0, B, "sequences");
    checks::size(op, name, *t, 1, H, "heads");
  }
  checks::unit_last_stride(op, "q_a", q_a);
  checks::size(op, "q_a", q_a, 0, B, "sequences");
  LOCUS_CHECK(Da >= 1 && Da < table.width, op, ": q_a's head dim ", Da, " must be below the cache width ", table.width);
  checks::size(op, "q_b", q_b, 2, table.width - Da, "head dim (cache width - q_a's)");
  checks::size(op, "out", out, 2, Da, "head dim");
  for (const Tensor* in : {&q_a, &q_b}) checks::no_overlap(op, "out", out, "a query", *in);
  if (B == 0 || H == 0) return;
  if (q_a.device().is_cpu()) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t S = host_length(op, table, b) + 1;
      const Tensor cache = host_cache(table, b, S);
      const Tensor kv = cache.slice(1, 0, Da).unsqueeze(1);
      cpu::mla_attention(q_a.slice(0, b, b + 1), q_b.slice(0, b, b + 1), kv, cache.slice(1, Da, table.width).unsqueeze(1),
                         kv, out.slice(0, b, b + 1), scale, S - 1, cpu::ThreadPool::from_native(stream.native));
    }
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::mla_attention_table(q_a, q_b, table, out, scale, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", q_a.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
