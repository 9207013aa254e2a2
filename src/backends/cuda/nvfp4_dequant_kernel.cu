// NVFP4 kCudaTiled -> bf16 rows (cuda_kernels.h), for the large-M NVFP4 GEMM through cuBLASLt.
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/mma_fragments.cuh"

namespace locus::cuda::detail {
namespace {

// One thread per (row tile, chunk, lane) of the padded weight: the lane's 16 bytes hold 16 K values
// of rows g and g + 8 (rows past n are skipped).
__global__ void nvfp4_dequant_kernel(const uint8_t* tiles, const uint16_t* scales, const float* global_scale, int64_t n,
                                     int64_t chunks, int64_t lanes_total, uint16_t* out, int64_t out_ld,
                                     float* alpha_out) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx == 0) *alpha_out = *global_scale * kNvfp4AccUnscale;
  if (idx >= lanes_total) return;
  const int lane = static_cast<int>(idx % 32);
  // Tiles in memory order (group-major, nvfp4_layout.h): group, chunk, row tile of the group.
  const int64_t tile = idx / 32, group_chunk = tile / kNvfp4GroupTiles;
  const int64_t c = group_chunk % chunks, rt = (group_chunk / chunks) * kNvfp4GroupTiles + tile % kNvfp4GroupTiles;
  const int g = lane >> 2, t = lane & 3;
  const uint4 wv = reinterpret_cast<const uint4*>(tiles)[idx];
  const uint32_t sc = scales[idx];
  const uint32_t s_lo = nvfp4_scale_pair(sc & 0xFFu), s_hi = nvfp4_scale_pair((sc >> 8) & 0xFFu);
  const int64_t k0 = c * kNvfp4ChunkK + 16 * t;
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = rt * kNvfp4TileRows + g + 8 * half;
    if (row >= n) continue;
    uint32_t r0[4], r1[4];
    nvfp4_dequant_word(words[2 * half], half ? s_hi : s_lo, r0);
    nvfp4_dequant_word(words[2 * half + 1], half ? s_hi : s_lo, r1);
    uint4* dst = reinterpret_cast<uint4*>(out + row * out_ld + k0);
    dst[0] = make_uint4(r0[0], r0[1], r0[2], r0[3]);
    dst[1] = make_uint4(r1[0], r1[1], r1[2], r1[3]);
  }
}

}  // namespace

void launch_nvfp4_dequant(const uint8_t* tiles, const uint16_t* scales, const float* global_scale, int64_t n,
                          int64_t chunks, uint16_t* out, int64_t out_ld, float* alpha_out, cudaStream_t stream) {
  const int64_t row_tiles = nvfp4_padded_rows(n) / kNvfp4TileRows;
  const int64_t lanes_total = row_tiles * chunks * 32;
  const int threads = 256;
  const int64_t blocks = (lanes_total + threads - 1) / threads;
  nvfp4_dequant_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(tiles, scales, global_scale, n, chunks,
                                                                              lanes_total, out, out_ld, alpha_out);
  LOCUS_CUDA_CHECK_LAUNCH("NVFP4 dequantize kernel launch");
}

}  // namespace locus::cuda::detail
