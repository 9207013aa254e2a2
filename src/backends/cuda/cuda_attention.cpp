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
#include "backends/cuda/stream_registry.h"

namespace locus::cuda {
namespace {

// A split covers at least this many keys, so each CTA's query-row load is amortized.
constexpr int64_t kMinKeysPerSplit = 2 * detail::kAttnTcKeys;

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
// tiles alone are too few, each split at least kMinKeysPerSplit keys.
detail::AttnSplit plan_splits(const detail::MlaAttentionArgs& a, cudaStream_t stream, int device) {
  const int64_t rows = a.per_head_groups ? a.T : a.T * a.H;
  const int64_t ctas = ceil_div(rows, detail::kAttnTcRows) * (a.per_head_groups ? a.H : 1);
  const int64_t keys = a.q_start + a.T;  // the most keys any row sees
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

}  // namespace

void mla_attention(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b, const Tensor& v,
                   const Tensor& out, float scale, int64_t q_start, void* stream) {
  const char* op = "cuda::mla_attention";
  LOCUS_CHECK(q_a.device().is_cuda(), op, ": q_a must be on a CUDA device, got ", q_a.describe());
  const int64_t T = q_a.size(0), H = q_a.size(1), S = k_a.size(0);
  const int64_t Da = q_a.size(2), Db = q_b.size(2), Dv = v.size(2);
  if (T == 0 || H == 0 || Dv == 0) return;
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  LOCUS_CHECK(S < kIntMax && Da < kIntMax && Db < kIntMax && Dv < kIntMax, op, ": sizes beyond the kernels' range (S ",
              S, ", head dims ", Da, ", ", Db, ", ", Dv, ")");
  const int device = q_a.device().index;
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != device) LOCUS_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = static_cast<cudaStream_t>(stream);

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
  a.T = T;
  a.H = H;
  a.S = S;
  a.Da = static_cast<int>(Da);
  a.Db = static_cast<int>(Db);
  a.Dv = static_cast<int>(Dv);
  a.q_start = q_start;
  a.scale = scale;
  a.v_is_k_a = same_view(v, k_a);
  a.per_head_groups = H > 1 && (k_a.size(1) > 1 || k_b.size(1) > 1 || v.size(1) > 1);

  const int smem_limit = device_attribute(device, cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const int tc_smem = detail::attn_tc_smem_bytes(a);
  if (tc_smem > 0 && tc_smem <= smem_limit) {
    detail::AttnSplit sp = plan_splits(a, s, device);
    if (sp.splits == 1) return detail::launch_attn_tc(a, sp, tc_smem, s);
    const size_t partial_floats = static_cast<size_t>(sp.splits) * static_cast<size_t>(T * H);
    float* scratch = static_cast<float*>(
        detail::scratch_alloc(partial_floats * (static_cast<size_t>(Dv) + 2) * sizeof(float), s));
    sp.partial_o = scratch;
    sp.partial_ml = scratch + partial_floats * static_cast<size_t>(Dv);
    detail::launch_attn_tc(a, sp, tc_smem, s);
    detail::launch_attn_combine(a, sp, s);
    detail::scratch_free(scratch, s);
    return;
  }
  const int simt_smem = detail::attn_simt_smem_bytes(a);
  LOCUS_CHECK(simt_smem <= smem_limit, op, ": head dims ", Da, " + ", Db, " and ", Dv, " need ", simt_smem,
              " bytes of shared memory per block, more than the device's ", smem_limit);
  detail::launch_attn_simt(a, s);
}

}  // namespace locus::cuda
