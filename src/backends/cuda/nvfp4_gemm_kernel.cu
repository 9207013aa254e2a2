// The NVFP4 weight-only GEMM: y[M, N] = x[M, K] (bf16) * dequant(W)^T on the kCudaTiled layout
// (nvfp4_layout.h). Decode-oriented (weights stream once from HBM):
// - the MMA is swapped, D^T = W x^T: 16 weight rows are the m16 side of mma.m16n8k16 (bf16),
//   8 tokens the n8 side, so M = 1..8 wastes nothing on the weight side;
// - every lane loads 16 bytes of weights (32 values, one scale block per row) per 64-K chunk,
//   with L1-bypassing streaming loads, U chunks in flight per warp;
// - dequantization is exact in registers: mask/shift to bf16 bits, one bf16x2 multiply by the
//   block scale; the global scale is applied to the fp32 result;
// - a CTA (8 warps) owns one 16-row tile and a K range (warps interleave chunks); when the grid
//   would be too small for the GPU, K is split over CTAs and the last CTA to finish a tile adds
//   the partial sums in a fixed order (deterministic) and writes the output;
// - any M: grid.y walks blocks of 8*MB tokens (weights are re-read per block; prefill sizes are
//   compute-bound anyway).
#include <cuda_bf16.h>

#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda::detail {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  const uint32_t neg_zero = 0x80008000u;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(neg_zero));
  return d;
}

// Four bf16x2 registers (pairs p = 0..3 of one word), already multiplied by the block scale.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t v = w >> (4 * p);
    const uint32_t bits = ((v & 0x00070007u) << 6) | ((v & 0x00080008u) << 12);
    r[p] = bf16x2_mul(bits, scale2);
  }
}

__device__ __forceinline__ uint32_t scale_pair(uint32_t code) {
  return code * 0x00100010u + (kNvfp4ScaleBf16Base | (kNvfp4ScaleBf16Base << 16));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One 16x64 weight tile times the activations of MB n8 blocks, accumulated into acc.
template <int MB>
__device__ __forceinline__ void tile_mma(const uint4& wv, uint32_t sc, const uint4 (&xv)[MB][2], float (&acc)[MB][4]) {
  uint32_t rg[8], rg8[8];
  const uint32_t s_g = scale_pair(sc & 0xFFu), s_g8 = scale_pair(sc >> 8);
  {
    uint32_t r[4];
    dequant_word(wv.x, s_g, r);
#pragma unroll
    for (int p = 0; p < 4; ++p) rg[p] = r[p];
    dequant_word(wv.y, s_g, r);
#pragma unroll
    for (int p = 0; p < 4; ++p) rg[4 + p] = r[p];
    dequant_word(wv.z, s_g8, r);
#pragma unroll
    for (int p = 0; p < 4; ++p) rg8[p] = r[p];
    dequant_word(wv.w, s_g8, r);
#pragma unroll
    for (int p = 0; p < 4; ++p) rg8[4 + p] = r[p];
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const uint32_t b0 = word_of(xv[b][(2 * s) / 4], (2 * s) % 4);
      const uint32_t b1 = word_of(xv[b][(2 * s + 1) / 4], (2 * s + 1) % 4);
      mma_bf16(acc[b], rg[2 * s], rg8[2 * s], rg[2 * s + 1], rg8[2 * s + 1], b0, b1);
    }
  }
}

struct SplitState {
  float* partials;     // [splits][grid.y][grid.x][E*32]
  unsigned* counters;  // [grid.y][grid.x], zero between launches
  int splits;
};

template <int MB, int U, bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32) nvfp4_gemm_kernel(Nvfp4GemmArgs a, SplitState sp) {
  constexpr int H = SWIGLU ? 2 : 1;   // gate (and up) halves
  constexpr int E = H * MB * 4;       // accumulator entries per lane
  __shared__ float red[kWarps][E][32];
  __shared__ unsigned s_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t rt = blockIdx.x;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * 8 * MB;
  const int64_t C = a.k_chunks;
  const int64_t c_begin = C * blockIdx.z / sp.splits, c_end = C * (blockIdx.z + 1) / sp.splits;
  const int64_t tile_rows[2] = {rt, rt + a.up_tile_offset};

  float acc[H][MB][4];
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[h][b][r] = 0.f;

  const uint16_t* xrow[MB];
  bool mrow_ok[MB];
#pragma unroll
  for (int b = 0; b < MB; ++b) {
    const int64_t m = m0 + 8 * b + g;
    mrow_ok[b] = m < a.m;
    xrow[b] = a.x + (mrow_ok[b] ? m : 0) * a.x_ld;
  }

  for (int64_t cb = c_begin + warp; cb < c_end; cb += static_cast<int64_t>(kWarps) * U) {
    uint4 wv[U][H];
    uint32_t sc[U][H];
    uint4 xv[U][MB][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = cb + static_cast<int64_t>(u) * kWarps;
      const bool valid = c < c_end;
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const int64_t tile = tile_rows[h] * C + (valid ? c : c_begin);
        wv[u][h] = ld_stream(a.w_tiles + (tile * 32 + lane) * 16);
        sc[u][h] = a.w_scales[tile * 32 + lane];
      }
      const int64_t kb = c * kNvfp4ChunkK + 16 * t;
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        if (valid && mrow_ok[b] && kb < a.k) {
          const uint4* p = reinterpret_cast<const uint4*>(xrow[b] + kb);
          xv[u][b][0] = __ldg(p);
          xv[u][b][1] = __ldg(p + 1);
        } else {
          xv[u][b][0] = make_uint4(0, 0, 0, 0);
          xv[u][b][1] = make_uint4(0, 0, 0, 0);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (cb + static_cast<int64_t>(u) * kWarps < c_end) {
#pragma unroll
        for (int h = 0; h < H; ++h) tile_mma<MB>(wv[u][h], sc[u][h], xv[u], acc[h]);
      }
    }
  }

  // Reduce the warps' partial sums in a fixed order.
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[warp][(h * MB + b) * 4 + r][lane] = acc[h][b][r];
  __syncthreads();
  const int tid = threadIdx.x;
  constexpr int kEntries = E * 32;
  float v[(kEntries + kWarps * 32 - 1) / (kWarps * 32)];
#pragma unroll
  for (int i = 0; i * kWarps * 32 < kEntries; ++i) {
    const int e = tid + i * kWarps * 32;
    float s = 0.f;
    if (e < kEntries) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][e / 32][e % 32];
    }
    v[i] = s;
  }

  if (sp.splits > 1) {
    const int64_t tile_id = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
    const int64_t tiles = static_cast<int64_t>(gridDim.x) * gridDim.y;
    float* mine = sp.partials + (static_cast<int64_t>(blockIdx.z) * tiles + tile_id) * kEntries;
#pragma unroll
    for (int i = 0; i * kWarps * 32 < kEntries; ++i) {
      const int e = tid + i * kWarps * 32;
      if (e < kEntries) __stcg(mine + e, v[i]);
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(sp.counters + tile_id, 1u) == static_cast<unsigned>(sp.splits - 1);
    __syncthreads();
    if (!s_last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i * kWarps * 32 < kEntries; ++i) {
      const int e = tid + i * kWarps * 32;
      float s = 0.f;
      if (e < kEntries)
        for (int z = 0; z < sp.splits; ++z) s += __ldcg(sp.partials + (static_cast<int64_t>(z) * tiles + tile_id) * kEntries + e);
      v[i] = s;
    }
    if (tid == 0) sp.counters[tile_id] = 0;  // ready for the next launch (graph replays too)
  }

  // Finalize: stage the sums (reusing red[0]), then one thread per output element.
  __syncthreads();
#pragma unroll
  for (int i = 0; i * kWarps * 32 < kEntries; ++i) {
    const int e = tid + i * kWarps * 32;
    if (e < kEntries) red[0][e / 32][e % 32] = v[i];
  }
  __syncthreads();
  const float gs = *a.global_scale * kNvfp4AccUnscale;
  constexpr int kOut = MB * 4 * 32;
  for (int e = tid; e < kOut; e += kWarps * 32) {
    const int slot = e / 32, ln = e % 32;  // slot = b*4 + r
    const int b = slot / 4, r = slot % 4;
    const int row = (ln >> 2) + 8 * (r >> 1), col = 2 * (ln & 3) + (r & 1);
    const int64_t n = rt * kNvfp4TileRows + row, m = m0 + 8 * b + col;
    if (n >= a.n || m >= a.m) continue;
    float out = red[0][slot][ln] * gs;
    if (SWIGLU) {
      const float up = red[0][MB * 4 + slot][ln] * gs;
      out = out / (1.f + __expf(-out)) * up;
    } else if (a.bias) {
      out += a.bias_f32 ? static_cast<const float*>(a.bias)[n]
                        : __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[n]);
    }
    if (a.y_f32) static_cast<float*>(a.y)[m * a.y_ld + n] = out;
    else static_cast<__nv_bfloat16*>(a.y)[m * a.y_ld + n] = __float2bfloat16_rn(out);
  }
}

// Per-(device, stream) split-K scratch. Grown outside the stream order (relaxed capture mode);
// an outgrown buffer is kept alive, since a captured graph may still use it.
struct SplitScratch {
  float* partials = nullptr;
  size_t partial_cap = 0;
  unsigned* counters = nullptr;
  size_t counter_cap = 0;
};

std::mutex g_scratch_mu;

SplitState split_state(cudaStream_t stream, int splits, size_t partial_floats, size_t counters) {
  SplitState st{nullptr, nullptr, splits};
  if (splits <= 1) return st;
  static auto* scratch = new std::map<std::pair<int, cudaStream_t>, SplitScratch>();
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  SplitScratch& s = (*scratch)[{dev, stream}];
  if (s.partial_cap < partial_floats || s.counter_cap < counters) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    LOCUS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaError_t err = cudaSuccess;
    if (s.partial_cap < partial_floats) {
      size_t cap = std::max(partial_floats, 2 * s.partial_cap);
      err = cudaMalloc(&s.partials, cap * sizeof(float));
      if (err == cudaSuccess) s.partial_cap = cap;
    }
    if (err == cudaSuccess && s.counter_cap < counters) {
      size_t cap = std::max(counters, 2 * s.counter_cap);
      err = cudaMalloc(&s.counters, cap * sizeof(unsigned));
      cudaStream_t side = nullptr;
      if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
      if (err == cudaSuccess) err = cudaMemsetAsync(s.counters, 0, cap * sizeof(unsigned), side);
      if (err == cudaSuccess) err = cudaStreamSynchronize(side);
      if (side) cudaStreamDestroy(side);
      if (err == cudaSuccess) s.counter_cap = cap;
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    LOCUS_CUDA_CHECK_NAMED(err, "allocating the NVFP4 split-K scratch");
  }
  st.partials = s.partials;
  st.counters = s.counters;
  return st;
}

int device_sm_count() {
  static int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  return sms;
}

template <int MB, int U, bool SW>
void launch_cfg(const Nvfp4GemmArgs& a, int64_t row_tiles, int64_t m_blocks, cudaStream_t stream) {
  int sms = partition_stream_sm_count(stream);
  if (sms <= 0) sms = device_sm_count();
  const int64_t blocks = row_tiles * m_blocks;
  // Enough CTAs for ~6 per SM; never fewer than one chunk per warp per split.
  int64_t splits = (6LL * sms + blocks - 1) / blocks;
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, a.k_chunks / kWarps));
  splits = std::max<int64_t>(1, std::min<int64_t>(splits, 16));
  constexpr int E = (SW ? 2 : 1) * MB * 4 * 32;
  SplitState sp = split_state(stream, static_cast<int>(splits), static_cast<size_t>(splits * blocks * E),
                              static_cast<size_t>(blocks));
  dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(m_blocks), static_cast<unsigned>(splits));
  nvfp4_gemm_kernel<MB, U, SW><<<grid, kWarps * 32, 0, stream>>>(a, sp);
  LOCUS_CUDA_CHECK_LAUNCH("NVFP4 GEMM kernel launch");
}

template <bool SW>
void launch_for_m(const Nvfp4GemmArgs& a, int64_t row_tiles, cudaStream_t stream) {
  if (a.m <= 8) launch_cfg<1, 4, SW>(a, row_tiles, (a.m + 7) / 8, stream);
  else if (a.m <= 16) launch_cfg<2, 2, SW>(a, row_tiles, (a.m + 15) / 16, stream);
  else launch_cfg<4, 1, SW>(a, row_tiles, (a.m + 31) / 32, stream);
}

}  // namespace

void launch_nvfp4_gemm(const Nvfp4GemmArgs& a, cudaStream_t stream) {
  if (a.m == 0 || a.n == 0) return;
  LOCUS_CHECK((a.m + 31) / 32 <= 65535, "NVFP4 GEMM: M = ", a.m, " is too large for one launch");
  const int64_t row_tiles = (a.n + kNvfp4TileRows - 1) / kNvfp4TileRows;
  if (a.swiglu) launch_for_m<true>(a, row_tiles, stream);
  else launch_for_m<false>(a, row_tiles, stream);
}

}  // namespace locus::cuda::detail
