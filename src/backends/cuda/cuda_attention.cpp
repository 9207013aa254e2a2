// MLA attention on CUDA (cuda_attention.h): operands to kernel arguments, the choice between the
// tensor-core kernel (bf16 inputs, Dv <= 512) and the CUDA-core one, and the key-split plan that
// fills the GPU (or the stream's SM partition) when there are few query rows.
#include "backends/cuda/cuda_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cublaslt_matmul.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kv_table.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda {
namespace {

// A split covers at least this many keys, so each CTA's query-row load is amortized.
constexpr int64_t kMinKeysPerSplit = 2 * detail::kAttnTcKeys;
// Decode runs on the decode kernel where its sequences' keys, summed, are at most this many
// (set_attention_decode_max_keys), or each sequence's are at most kDecodeShortKeys of them and
// one key split of every sequence takes at most two CTAs per SM (decode_kernel_fits).
detail::EnvCount g_decode_max_keys{"LOCUS_ATTN_DECODE_MAX_KEYS", 512};
constexpr int64_t kDecodeShortKeys = 192;
// The decode kernel's key splits cover at least this many keys (set_attention_decode_split_keys):
// shorter splits spread a short context over more SMs, each split more costs the combine.
detail::EnvCount g_decode_split_keys{"LOCUS_ATTN_DECODE_SPLIT_KEYS", 64};
// The decode kernel merges its key splits in its last CTA of each head group, not in a second
// launch (set_attention_decode_fused_combine).
detail::EnvToggle g_decode_fused_combine{"LOCUS_ATTN_DECODE_FUSED_COMBINE", true};

detail::AttnOperand operand(const Tensor& t) {
  // A one-head operand is shared by every query head: head stride 0.
  return {t.data_ptr(), t.stride(0), t.size(1) == 1 ? 0 : t.stride(1), t.dtype() == DType::kFP32};
}

bool same_view(const Tensor& a, const Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         a.strides() == b.strides();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Key splits: enough CTAs for every SM of the stream's partition (or the device) when the row
// tiles alone (of every sequence in the launch) are too few, each split at least
// kMinKeysPerSplit keys; `keys` is the most keys any row sees.
detail::AttnSplit plan_splits(const detail::MlaAttentionArgs& a, int64_t keys, cudaStream_t stream, int device) {
  const int64_t rows = a.per_head_groups ? a.T : a.T * a.H;
  const int64_t ctas = ceil_div(rows, detail::kAttnTcRows) * (a.per_head_groups ? a.H : 1) * std::max(a.num_seqs, 1);
  int sms = detail::partition_stream_sm_count(stream);
  if (sms <= 0) sms = device_attribute(device, cudaDevAttrMultiProcessorCount);
  const int64_t slots = static_cast<int64_t>(sms) * detail::attn_tc_ctas_per_sm(a, device);
  int64_t splits = 1;
  if (ctas < slots) {
    splits = std::min({ceil_div(slots, ctas), ceil_div(keys, kMinKeysPerSplit), int64_t{detail::kAttnMaxSplits}});
  }
  detail::AttnSplit sp;
  sp.split_keys = ceil_div(ceil_div(keys, splits), detail::kAttnTcKeys) * detail::kAttnTcKeys;
  sp.splits = static_cast<int>(ceil_div(keys, sp.split_keys));
  return sp;
}

// The kernel arguments of one mla_attention call (sizes checked against int range).
detail::MlaAttentionArgs make_args(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b,
                                   const Tensor& v, const Tensor& out, float scale, int64_t q_start) {
  const char* op = "cuda::mla_attention";
  const int64_t S = k_a.size(0), Da = q_a.size(2), Db = q_b.size(2), Dv = v.size(2);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  LOCUS_CHECK(S < kIntMax && Da < kIntMax && Db < kIntMax && Dv < kIntMax, op, ": sizes beyond the kernels' range (S ",
              S, ", head dims ", Da, ", ", Db, ", ", Dv, ")");
  detail::MlaAttentionArgs a;
  a.q_a = operand(q_a);
  a.q_b = operand(q_b);
  a.k_a = operand(k_a);
  a.k_b = operand(k_b);
  a.v = operand(v);
  a.out = out.data_ptr();
  a.out_row_stride = out.stride(0);
  a.out_head_stride = out.stride(1);
  a.out_f32 = out.dtype() == DType::kFP32;
  a.T = q_a.size(0);
  a.H = q_a.size(1);
  a.S = S;
  a.Da = static_cast<int>(Da);
  a.Db = static_cast<int>(Db);
  a.Dv = static_cast<int>(Dv);
  a.q_start = q_start;
  a.scale = scale;
  a.v_is_k_a = same_view(v, k_a);
  a.per_head_groups = a.H > 1 && (k_a.size(1) > 1 || k_b.size(1) > 1 || v.size(1) > 1);
  return a;
}

// Shared memory the tensor-core kernel needs for `a`, or 0 when it does not apply or does not fit.
int tc_smem_fitting(const detail::MlaAttentionArgs& a, int device) {
  const int tc_smem = detail::attn_tc_smem_bytes(a);
  return tc_smem > 0 && tc_smem <= device_attribute(device, cudaDevAttrMaxSharedMemoryPerBlockOptin) ? tc_smem : 0;
}

// Runs `launch` with the split plan `sp`, then the combine of its key splits when there are several
// (unless the kernel merges them itself: `fused_combine_counters`, the decode kernel's counters).
template <typename Launch>
void run_splits(detail::MlaAttentionArgs& a, detail::AttnSplit sp, cudaStream_t s, Launch launch,
                size_t fused_combine_counters = 0) {
  if (sp.splits == 1) return launch(sp);
  // [sequences][splits][T*H] slots of Dv partial sums, then of (max, sum).
  // The stream's own attention scratch (stream_scratch.h): no graph memory nodes. It stays
  // allocated; splits are planned only while the CTAs are fewer than the SMs' slots, so it holds
  // at most about 2 x 64 rows per slot (under 100 MB at 128 heads on 132 SMs).
  const size_t partial_floats =
      static_cast<size_t>(std::max(a.num_seqs, 1)) * static_cast<size_t>(sp.splits) * static_cast<size_t>(a.T * a.H);
  const size_t floats = partial_floats * (static_cast<size_t>(a.Dv) + 2);
  const detail::StreamScratch scratch =
      detail::stream_scratch(s, fused_combine_counters, (floats + 3) / 4, detail::ScratchUser::kAttention);
  sp.partial_o = reinterpret_cast<float*>(scratch.partials);
  sp.partial_ml = sp.partial_o + partial_floats * static_cast<size_t>(a.Dv);
  if (fused_combine_counters > 0) sp.counters = scratch.counters;
  launch(sp);
  if (sp.counters == nullptr) detail::launch_attn_combine(a, sp, s);
}

// The SMs a launch on `stream` can use: its partition's, or the device's.
int64_t stream_sms(cudaStream_t stream, int device) {
  const int sms = detail::partition_stream_sm_count(stream);
  return sms > 0 ? sms : device_attribute(device, cudaDevAttrMultiProcessorCount);
}

// The decode kernel's CTAs for one key split of every sequence in `a`.
int64_t decode_ctas_per_split(const detail::MlaAttentionArgs& a) {
  return ceil_div(a.H, detail::kAttnDecodeHeads) * std::max(a.num_seqs, 1);
}

// The decode kernel's key splits: at most one CTA per SM of the stream's partition (or the
// device; a second CTA on an SM shares its FP32 units and took longer: cuda_attention_bench, H100,
// docs/benchmarks.md), each split at least g_decode_split_keys keys.
detail::AttnSplit plan_decode_splits(const detail::MlaAttentionArgs& a, int64_t keys, cudaStream_t stream,
                                     int device) {
  const int64_t fill = std::max<int64_t>(1, stream_sms(stream, device) / decode_ctas_per_split(a));
  detail::AttnSplit sp;
  const int64_t min_split = std::max<int64_t>(1, g_decode_split_keys.get());
  sp.split_keys = std::min<int64_t>(std::max(min_split, ceil_div(keys, fill)), detail::kAttnDecodeMaxSplitKeys);
  sp.splits = static_cast<int>(ceil_div(keys, sp.split_keys));
  return sp;
}

// Whether decode over `keys` keys at most for each of `seqs` sequences (`ctas` CTAs a key split, on
// `sms` SMs) takes the decode kernel: at short contexts it is latency that counts, and the
// tensor-core kernel's 64-row CTAs take longer (cuda_attention_bench, H100, twenty-sixth session:
// at 1 sequence the decode kernel was faster up to 512 keys, at 4 and 8 up to 192 (0.80 of the
// tensor-core kernel's time there), even at 256 and slower beyond; at 16 sequences, more CTAs
// than two per SM, faster only at 64 keys (0.91), even at 128).
bool decode_kernel_fits(int64_t keys, int64_t seqs, int64_t ctas, int64_t sms) {
  const int64_t max_keys = g_decode_max_keys.get();
  if (max_keys <= 0) return false;
  return keys * seqs <= max_keys || (keys <= std::min(kDecodeShortKeys, max_keys) && ctas <= 2 * sms);
}

// The kernel for `a` over `keys` keys at most: the decode kernel where it applies and the keys are
// few (decode_kernel_fits), else the tensor-core one (tc_smem: its shared memory,
// tc_smem_fitting).
void run(detail::MlaAttentionArgs& a, int64_t keys, int tc_smem, cudaStream_t s, int device) {
  const bool splits_fit = ceil_div(keys, detail::kAttnDecodeMaxSplitKeys) <= detail::kAttnMaxSplits;
  if (decode_kernel_fits(keys, std::max(a.num_seqs, 1), decode_ctas_per_split(a), stream_sms(s, device)) &&
      splits_fit && detail::attn_decode_applies(a)) {
    const size_t counters = g_decode_fused_combine.on() ? static_cast<size_t>(decode_ctas_per_split(a)) : 0;
    return run_splits(
        a, plan_decode_splits(a, keys, s, device), s,
        [&](const detail::AttnSplit& sp) { detail::launch_attn_decode(a, sp, s); }, counters);
  }
  run_splits(a, plan_splits(a, keys, s, device), s,
             [&](const detail::AttnSplit& sp) { detail::launch_attn_tc(a, sp, tc_smem, s); });
}

// Element offset of `t`'s data from `base`'s (both bf16 views of device memory), when whole.
bool element_delta(const Tensor& t, const Tensor& base, int64_t* delta) {
  const auto diff = reinterpret_cast<intptr_t>(t.data_ptr()) - reinterpret_cast<intptr_t>(base.data_ptr());
  if (diff % 2 != 0) return false;
  *delta = static_cast<int64_t>(diff / 2);
  return true;
}

// Whether every sequence's keys have sequence 0's layout (dtypes, heads, strides, the offsets of
// k_b and v from k_a), so that one launch can carry them as pointers to k_a.
bool same_key_layout(const std::vector<ops::AttentionKeys>& keys, int64_t* k_b_delta, int64_t* v_delta) {
  const ops::AttentionKeys& k0 = keys[0];
  if (!element_delta(k0.k_b, k0.k_a, k_b_delta) || !element_delta(k0.v, k0.k_a, v_delta)) return false;
  for (const ops::AttentionKeys& k : keys) {
    int64_t kb = 0, vd = 0;
    for (auto [t, t0] : {std::pair{&k.k_a, &k0.k_a}, std::pair{&k.k_b, &k0.k_b}, std::pair{&k.v, &k0.v}}) {
      if (t->dtype() != DType::kBF16 || t->dtype() != t0->dtype() || t->size(1) != t0->size(1) ||
          t->size(2) != t0->size(2) || t->strides() != t0->strides())
        return false;
    }
    if (!element_delta(k.k_b, k.k_a, &kb) || !element_delta(k.v, k.k_a, &vd) || kb != *k_b_delta || vd != *v_delta)
      return false;
  }
  return true;
}

}  // namespace

void set_attention_decode_max_keys(int64_t keys) { g_decode_max_keys.set(keys); }
void set_attention_decode_split_keys(int64_t keys) { g_decode_split_keys.set(keys); }
void set_attention_decode_fused_combine(int64_t on) { g_decode_fused_combine.set_or_reset(on); }

void mla_attention(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b, const Tensor& v,
                   const Tensor& out, float scale, int64_t q_start, void* stream) {
  const char* op = "cuda::mla_attention";
  LOCUS_CHECK(q_a.device().is_cuda(), op, ": q_a must be on a CUDA device, got ", q_a.describe());
  if (q_a.size(0) == 0 || q_a.size(1) == 0 || v.size(2) == 0) return;
  use_device(q_a.device().index);
  const int device = q_a.device().index;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  detail::MlaAttentionArgs a = make_args(q_a, q_b, k_a, k_b, v, out, scale, q_start);
  if (const int tc_smem = tc_smem_fitting(a, device)) return run(a, a.q_start + a.T, tc_smem, s, device);
  const int simt_smem = detail::attn_simt_smem_bytes(a);
  const int smem_limit = device_attribute(device, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  LOCUS_CHECK(simt_smem <= smem_limit, op, ": head dims ", a.Da, " + ", a.Db, " and ", a.Dv, " need ", simt_smem,
              " bytes of shared memory per block, more than the device's ", smem_limit);
  detail::launch_attn_simt(a, s);
}

void mla_attention_batch(const Tensor& q_a, const Tensor& q_b, const std::vector<ops::AttentionKeys>& keys,
                         const Tensor& out, float scale, void* stream) {
  const int64_t B = static_cast<int64_t>(keys.size()), T = q_a.size(0) / B;
  auto one_by_one = [&](int64_t first) {
    for (int64_t i = first; i < B; ++i) {
      const ops::AttentionKeys& k = keys[static_cast<size_t>(i)];
      mla_attention(q_a.slice(0, i * T, (i + 1) * T), q_b.slice(0, i * T, (i + 1) * T), k.k_a, k.k_b, k.v,
                    out.slice(0, i * T, (i + 1) * T), scale, k.k_a.size(0) - T, stream);
    }
  };
  int64_t k_b_delta = 0, v_delta = 0;
  if (B == 1 || q_a.size(1) == 0 || !same_key_layout(keys, &k_b_delta, &v_delta)) return one_by_one(0);
  use_device(q_a.device().index);
  const int device = q_a.device().index;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (int64_t first = 0; first < B; first += detail::kAttnMaxSeqs) {
    const int64_t n = std::min<int64_t>(detail::kAttnMaxSeqs, B - first);
    const ops::AttentionKeys& k0 = keys[static_cast<size_t>(first)];
    const Tensor qa = q_a.slice(0, first * T, (first + n) * T), qb = q_b.slice(0, first * T, (first + n) * T);
    const Tensor o = out.slice(0, first * T, (first + n) * T);
    detail::MlaAttentionArgs a = make_args(qa.slice(0, 0, T), qb.slice(0, 0, T), k0.k_a, k0.k_b, k0.v,
                                           o.slice(0, 0, T), scale, k0.k_a.size(0) - T);
    const int tc_smem = tc_smem_fitting(a, device);
    if (tc_smem == 0) return one_by_one(first);  // the CUDA-core kernel takes one sequence at a time
    a.num_seqs = static_cast<int>(n);
    a.k_b_delta = k_b_delta;
    a.v_delta = v_delta;
    int64_t keys_max = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Tensor& k_a = keys[static_cast<size_t>(first + i)].k_a;
      LOCUS_CHECK(k_a.size(0) < std::numeric_limits<int32_t>::max(), "cuda::mla_attention_batch: ", k_a.size(0),
                  " keys are beyond the kernel's range");
      a.seq_k_a[i] = k_a.data_ptr();
      a.seq_keys[i] = static_cast<int32_t>(k_a.size(0));
      keys_max = std::max(keys_max, k_a.size(0));
    }
    a.S = keys_max;
    run(a, keys_max, tc_smem, s, device);
  }
}

void mla_attention_table(const Tensor& q_a, const Tensor& q_b, const ops::KvTable& table, const Tensor& out,
                         float scale, void* stream) {
  const char* op = "cuda::mla_attention_table";
  LOCUS_CHECK(q_a.device().is_cuda(), op, ": q_a must be on a CUDA device, got ", q_a.describe());
  LOCUS_CHECK(table.max_keys < std::numeric_limits<int32_t>::max(), op, ": ", table.max_keys,
              " keys are beyond the kernel's range");
  const int64_t B = q_a.size(0), Da = q_a.size(2);
  use_device(q_a.device().index);
  const int device = q_a.device().index;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (int64_t first = 0; first < B; first += detail::kAttnMaxSeqs) {
    const int64_t n = std::min<int64_t>(detail::kAttnMaxSeqs, B - first);
    // Sequence 0's operands stand for every sequence's (their addresses come from the table): k_a
    // and v are the cache's first Da columns, k_b the rest, one head shared by all query heads.
    detail::MlaAttentionArgs a = make_args(q_a.slice(0, first, first + 1), q_b.slice(0, first, first + 1),
                                           q_a.slice(0, first, first + 1), q_b.slice(0, first, first + 1),
                                           q_a.slice(0, first, first + 1), out.slice(0, first, first + 1), scale, 0);
    a.k_a = {nullptr, table.width, 0, false};
    a.k_b = {nullptr, table.width, 0, false};
    a.v = a.k_a;
    a.v_is_k_a = true;
    a.per_head_groups = false;
    a.S = table.max_keys;
    a.num_seqs = static_cast<int>(n);
    a.k_b_delta = Da;
    a.v_delta = 0;
    a.table_rows = table.rows.data<int64_t>() + first;
    a.table_lengths = table.lengths.data<int32_t>() + first;
    const int tc_smem = tc_smem_fitting(a, device);
    LOCUS_CHECK(tc_smem > 0, op, ": head dims ", a.Da, " + ", a.Db, " have no tensor-core kernel on this device");
    run(a, table.max_keys, tc_smem, s, device);
  }
}

}  // namespace locus::cuda
