// Internal to the CUDA backend's attention kernels (device code): merging key splits' partial
// results (AttnSplit) into one output row, in split order. The combine kernel and the decode
// kernel's last CTA of a head group (its fused combine) share these, so both give the same bits.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace locus::cuda::detail {

// The weights of one (token, head) row's split results: w[z] = 2^(m_z - max m) (0 for a split
// that saw no key); returns 1 / sum_z w[z] l_z. max_of(z) and sum_of(z) give split z's m_z, l_z.
template <typename Max, typename Sum>
__device__ __forceinline__ float attn_split_weights_of(int splits, Max max_of, Sum sum_of, float* w) {
  float m = -INFINITY;
  for (int z = 0; z < splits; ++z) m = fmaxf(m, max_of(z));
  float l = 0.f;
  for (int z = 0; z < splits; ++z) {
    const float mz = max_of(z);
    const float wz = mz == -INFINITY ? 0.f : exp2f(mz - m);
    w[z] = wz;
    l = fmaf(wz, sum_of(z), l);
  }
  return 1.f / l;
}

// The same, read from the partials: `ml` is split 0's (max, sum) pair, `stride` the floats from
// one split's pair to the next. Read through L2 (__ldcg): the splits may have been written by
// other CTAs of the same launch.
__device__ __forceinline__ float attn_split_weights(const float* ml, int64_t stride, int splits, float* w) {
  return attn_split_weights_of(
      splits, [&](int z) { return __ldcg(ml + z * stride); }, [&](int z) { return __ldcg(ml + z * stride + 1); }, w);
}

// One merged output value, rounded to the output's type.
__device__ __forceinline__ void attn_store_output(void* out, bool out_f32, int64_t off, float v) {
  if (out_f32) static_cast<float*>(out)[off] = v;
  else static_cast<__nv_bfloat16*>(out)[off] = __float2bfloat16_rn(v);
}

// One (token, head) row of the output, merged from its splits: out[off + d] = sum_z w[z] o_z[d] *
// inv_l (fp32 or rounded to bf16), for d = tid, tid + threads, ... < Dv. `o` is split 0's partial
// sums, `stride` the floats from one split's to the next.
__device__ __forceinline__ void attn_write_combined_row(const float* o, int64_t stride, int splits, const float* w,
                                                        float inv_l, void* out, bool out_f32, int64_t off, int Dv,
                                                        int tid, int threads) {
  for (int d = tid; d < Dv; d += threads) {
    float sum = 0.f;
    for (int z = 0; z < splits; ++z) sum = fmaf(w[z], __ldcg(o + d + z * stride), sum);
    attn_store_output(out, out_f32, off + d, sum * inv_l);
  }
}

}  // namespace locus::cuda::detail
