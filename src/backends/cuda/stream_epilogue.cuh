// Internal to the CUDA backend (device code): how the weight kernels (stream_gemm.h,
// nvfp4_wgmma.h) write a finished 16-row tile of outputs: scale, bias or SwiGLU, bf16 or fp32.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backends/cuda/stream_gemm.h"

namespace locus::cuda::detail {

__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

// v[h][b][r]: the tile's sums (h = 0, or gate and up with H = 2) in mma C-fragment order for
// tokens 8b..8b+7 (lane = 4g + t holds rows g, g + 8 and tokens 2t, 2t + 1), times `scale`.
// Outputs past the part's rows or the activations' M are dropped.
template <int MB, int H>
__device__ __forceinline__ void store_fragments(const StreamGemmArgs& a, const StreamGemmPart& p, int batch, int tile,
                                                int lane, float scale, const float (&v)[H][MB][4]) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int b = 0; b < MB; ++b) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int n = tile * 16 + g + 8 * (r >> 1);
      const int m = 8 * b + 2 * t + (r & 1);
      if (n >= p.rows || m >= a.m) continue;
      float out = v[0][b][r] * scale;
      if constexpr (H == 2) {
        out = silu(out) * (v[1][b][r] * scale);
      } else if (p.bias) {
        out += a.bias_f32 ? static_cast<const float*>(p.bias)[n]
                          : __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[n]);
      }
      const int64_t at = static_cast<int64_t>(m) * a.y_ld + p.y_offset + batch * p.y_batch_stride + n;
      if (a.y_f32) static_cast<float*>(a.y)[at] = out;
      else static_cast<__nv_bfloat16*>(a.y)[at] = __float2bfloat16_rn(out);
    }
  }
}

}  // namespace locus::cuda::detail
