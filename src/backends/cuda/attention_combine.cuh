// Internal to the CUDA backend's attention kernels (device code): merging key splits' partial
// results (AttnSplit) into one output row, in split order. The combine kernel and the decode
// kernel's last CTA of a head group (its fused combine) share these, so both give the same bits.
#pragma once
#include <cstdint>

namespace locus::cuda::detail {

// The weights of one (token, head) row's split results: w[z] = 2^(m_z - max m) (0 for a split
// that saw no key); returns 1 / sum_z w[z] l_z. `ml` is split 0's (max, sum) pair, `stride` the
// floats from one split's pair to the next. Read through L2 (__ldcg): the splits may have been
// written by other CTAs of the same launch.
__device__ __forceinline__ float attn_split_weights(const float* ml, int64_t stride, int splits, float* w) {
  float m = -INFINITY;
  for (int z = 0; z < splits; ++z) m = fmaxf(m, __ldcg(ml + z * stride));
  float l = 0.f;
  for (int z = 0; z < splits; ++z) {
    const float mz = __ldcg(ml + z * stride);
    const float wz = mz == -INFINITY ? 0.f : exp2f(mz - m);
    w[z] = wz;
    l = fmaf(wz, __ldcg(ml + z * stride + 1), l);
  }
  return 1.f / l;
}

// One output element of a row: sum_z w[z] o_z * inv_l, from split 0's partial sum `o` and the
// floats `stride` from one split's to the next.
__device__ __forceinline__ float attn_combined(const float* o, int64_t stride, int splits, const float* w,
                                               float inv_l) {
  float sum = 0.f;
  for (int z = 0; z < splits; ++z) sum = fmaf(w[z], __ldcg(o + z * stride), sum);
  return sum * inv_l;
}

}  // namespace locus::cuda::detail
