// The BF16 decode matrix-vector kernel on tensor cores (bf16_gemv.h), for 1-8 tokens: a warp
// multiplies 16 weight rows by the tokens with mma.sync m16n8k16 (weights on the m side, tokens on
// the n side, unused token columns zero), so its cost per weight byte does not grow with the
// tokens as the CUDA-core kernel's does. A CTA of 8 warps takes G groups of 16 rows; the 8 / G
// warps of a group split its K into contiguous runs of 64-K chunks.
//
// A chunk is 128 bytes of each row. Lane l = 4g + t loads 16 bytes of rows g and g + 8 at bytes
// 16t and 64 + 16t of the chunk (each load instruction of the warp covers 64 contiguous bytes
// of 8 rows), and token g's activations at the same K. Word s of its first load is the A
// fragment's K pair t of mma step s, word s of its second load pair t + 4; the B fragment takes
// the activation words of the same places. A sum over K does not care about the order of its
// terms, so the permuted K gives the product.
#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/bf16_gemv_device.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/grid_dependency.cuh"
#include "backends/cuda/mma_fragments.cuh"

namespace locus::cuda::detail {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kChunkK = 64, kChunkVectors = kChunkK / 8;  // 16-byte vectors of a row's chunk
constexpr int kU = 2;  // chunks a lane's batch of loads covers

// One chunk's weights of a lane: rows g and g + 8, each at bytes 16t and 64 + 16t.
struct ChunkWeights {
  uint4 lo[2], hi[2];
};

__device__ __forceinline__ ChunkWeights load_chunk(const uint4* row_g, const uint4* row_g8, int64_t chunk, int t,
                                                   bool has_g, bool has_g8) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int64_t v = chunk * kChunkVectors + t;
  ChunkWeights c;
  c.lo[0] = has_g ? gemv_load_streamed(row_g + v) : zero;
  c.lo[1] = has_g ? gemv_load_streamed(row_g + v + 4) : zero;
  c.hi[0] = has_g8 ? gemv_load_streamed(row_g8 + v) : zero;
  c.hi[1] = has_g8 ? gemv_load_streamed(row_g8 + v + 4) : zero;
  return c;
}

// G groups of 16 rows per CTA.
template <int G>
__global__ void __launch_bounds__(kThreads) bf16_gemv_mma_kernel(Bf16GemvArgs a) {
  constexpr int kParts = kWarps / G;
  __shared__ float partial[kWarps][16][8];  // [warp][row of its group][token]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int group = warp / kParts, part = warp % kParts;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * G + group) * 16;
  const bool has_g = row0 + g < a.n, has_g8 = row0 + g + 8 < a.n;
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  const uint4* row_g = reinterpret_cast<const uint4*>(w + (has_g ? row0 + g : 0) * a.w_ld);
  const uint4* row_g8 = reinterpret_cast<const uint4*>(w + (has_g8 ? row0 + g + 8 : 0) * a.w_ld);
  const bool has_token = g < a.m;
  const uint4* x_row = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + (has_token ? g : 0) * a.x_ld);
  const int64_t chunks = a.k / kChunkK;
  const int64_t c_end = chunks * (part + 1) / kParts;
  int64_t c = chunks * part / kParts;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // The first batch of weights before the wait: they do not depend on the kernel before.
  ChunkWeights cw[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) cw[u] = load_chunk(row_g, row_g8, c + u, t, has_g && c + u < c_end, has_g8 && c + u < c_end);
  launch_dependents();
  wait_for_previous_grid();

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (; c < c_end; c += kU) {
    uint4 xv[kU][2];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool in = has_token && c + u < c_end;
      const int64_t v = (c + u) * kChunkVectors + t;
      xv[u][0] = in ? __ldg(x_row + v) : zero;
      xv[u][1] = in ? __ldg(x_row + v + 4) : zero;
    }
    ChunkWeights next[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool in = c + kU + u < c_end;
      next[u] = load_chunk(row_g, row_g8, c + kU + u, t, has_g && in, has_g8 && in);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int s = 0; s < 4; ++s)
        mma_bf16_16816(acc, uint4_word(cw[u].lo[0], s), uint4_word(cw[u].hi[0], s), uint4_word(cw[u].lo[1], s),
                       uint4_word(cw[u].hi[1], s), uint4_word(xv[u][0], s), uint4_word(xv[u][1], s));
#pragma unroll
    for (int u = 0; u < kU; ++u) cw[u] = next[u];
  }

  // acc: rows g, g + 8 of the group, tokens 2t, 2t + 1. The group's warps add up in part order.
  partial[warp][g][2 * t] = acc[0];
  partial[warp][g][2 * t + 1] = acc[1];
  partial[warp][g + 8][2 * t] = acc[2];
  partial[warp][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
  const int outputs = G * 16 * static_cast<int>(a.m);
  for (int i = threadIdx.x; i < outputs; i += kThreads) {
    const int out_group = i / (16 * static_cast<int>(a.m)), r = (i / static_cast<int>(a.m)) % 16,
              token = i % static_cast<int>(a.m);
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * G + out_group) * 16 + r;
    if (row >= a.n) continue;
    float s = partial[out_group * kParts][r][token];
#pragma unroll
    for (int p = 1; p < kParts; ++p) s += partial[out_group * kParts + p][r][token];
    gemv_store_output(a, token, row, s);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool bf16_gemv_mma_eligible(const Bf16GemvArgs& a) {
  return a.m >= 1 && a.m <= kBf16GemvMmaMaxM && a.n >= 1 && a.k >= kChunkK && a.k % kChunkK == 0 && a.w_ld % 8 == 0 &&
         (a.m == 1 || a.x_ld % 8 == 0) && aligned16(a.x) && aligned16(a.w);
}

int bf16_gemv_mma_row_groups(int64_t n, int64_t k, int sms) {
  // About 16 chunks a warp: K G / 512 of them with G groups of 8 / G warps each.
  int groups = 8;
  while (groups > 1 && k * groups > 8192) groups /= 2;
  // At least 2 CTAs an SM where the rows allow it (fewer rows split their K further).
  while (groups > 1 && (n + 16 * groups - 1) / (16 * groups) < 2 * static_cast<int64_t>(sms)) groups /= 2;
  return groups;
}

void launch_bf16_gemv_mma(const Bf16GemvArgs& a, cudaStream_t stream) {
  int device = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&device));
  const int groups = bf16_gemv_mma_row_groups(a.n, a.k, device_attribute(device, cudaDevAttrMultiProcessorCount));
  const dim3 grid(static_cast<unsigned>((a.n + 16 * groups - 1) / (16 * groups)));
  DependentLaunch launch(grid, dim3(kThreads), 0, stream, small_op_overlap());
  cudaError_t err = cudaErrorInvalidValue;
  switch (groups) {
    case 1: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_mma_kernel<1>, a); break;
    case 2: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_mma_kernel<2>, a); break;
    case 4: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_mma_kernel<4>, a); break;
    case 8: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_mma_kernel<8>, a); break;
  }
  LOCUS_CUDA_CHECK_NAMED(err, "bf16_gemv_mma_kernel launch failed");
}

}  // namespace locus::cuda::detail
