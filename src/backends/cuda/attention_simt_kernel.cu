// MLA attention on CUDA cores, for what the tensor-core kernel does not take: fp32 inputs (any
// mix with bf16), Dv > 512, or head dims whose tiles exceed shared memory.
// One warp per (token, head) walks its visible keys in order with an online softmax: the lanes
// split the head dims, the score is a fixed butterfly sum (identical in every lane), and each lane
// keeps the fp32 query values and output accumulators of its dims in shared memory.
#include <cuda_bf16.h>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cuda_check.h"

namespace locus::cuda::detail {
namespace {

constexpr int kWarps = 4;

__device__ __forceinline__ float load(const AttnOperand& o, int64_t off) {
  if (o.f32) return static_cast<const float*>(o.ptr)[off];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(o.ptr)[off]);
}

__global__ void __launch_bounds__(kWarps * 32) attn_simt_kernel(MlaAttentionArgs a) {
  extern __shared__ float sm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;  // t * H + h
  if (row >= a.T * a.H) return;  // the whole warp leaves; nothing below syncs the block
  const int dq = a.Da + a.Db;
  float* q = sm + static_cast<int64_t>(warp) * (dq + a.Dv);  // [q_a | q_b], then the accumulators
  float* acc = q + dq;
  const int64_t t = row / a.H, h = row % a.H;
  // Lane l only ever touches elements d = l (mod 32) of q and acc.
  for (int d = lane; d < a.Da; d += 32) q[d] = load(a.q_a, t * a.q_a.row_stride + h * a.q_a.head_stride + d);
  for (int d = lane; d < a.Db; d += 32) q[a.Da + d] = load(a.q_b, t * a.q_b.row_stride + h * a.q_b.head_stride + d);
  for (int d = lane; d < a.Dv; d += 32) acc[d] = 0.f;

  const float scale_log2 = a.scale * kAttnLog2e;
  float m = -INFINITY, l = 0.f;
  const int64_t visible = a.q_start + t + 1;
  for (int64_t s = 0; s < visible; ++s) {
    const int64_t ka = s * a.k_a.row_stride + h * a.k_a.head_stride, kb = s * a.k_b.row_stride + h * a.k_b.head_stride;
    float dot = 0.f;
    for (int d = lane; d < a.Da; d += 32) dot += q[d] * load(a.k_a, ka + d);
    for (int d = lane; d < a.Db; d += 32) dot += q[a.Da + d] * load(a.k_b, kb + d);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float x = dot * scale_log2;
    const float m_new = fmaxf(m, x);
    const float alpha = exp2f(m - m_new);  // 0 for the first key (m = -inf)
    const float p = exp2f(x - m_new);
    l = l * alpha + p;
    const int64_t vo = s * a.v.row_stride + h * a.v.head_stride;
    for (int d = lane; d < a.Dv; d += 32) acc[d] = acc[d] * alpha + p * load(a.v, vo + d);
    m = m_new;
  }
  const float inv = 1.f / l;
  const int64_t off = t * a.out_row_stride + h * a.out_head_stride;
  for (int d = lane; d < a.Dv; d += 32) {
    if (a.out_f32) static_cast<float*>(a.out)[off + d] = acc[d] * inv;
    else static_cast<__nv_bfloat16*>(a.out)[off + d] = __float2bfloat16_rn(acc[d] * inv);
  }
}

}  // namespace

int attn_simt_smem_bytes(const MlaAttentionArgs& a) {
  const int64_t bytes = static_cast<int64_t>(kWarps) * (static_cast<int64_t>(a.Da) + a.Db + a.Dv) * 4;
  return bytes > 0x7fffffff ? 0x7fffffff : static_cast<int>(bytes);
}

void launch_attn_simt(const MlaAttentionArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.T * a.H + kWarps - 1) / kWarps;
  LOCUS_CHECK(blocks <= 0x7fffffff, "MLA attention: ", a.T * a.H, " (token, head) rows do not fit one launch");
  const int smem = attn_simt_smem_bytes(a);
  raise_dynamic_smem_limit(reinterpret_cast<const void*>(&attn_simt_kernel), smem);
  attn_simt_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(a);
  LOCUS_CUDA_CHECK_LAUNCH("MLA attention (CUDA-core) kernel launch");
}

}  // namespace locus::cuda::detail
