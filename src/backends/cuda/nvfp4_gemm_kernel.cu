// The NVFP4 weight-only GEMM: y[M, N] = x[M, K] (bf16) * dequant(W)^T on the kCudaTiled layout
// (nvfp4_layout.h). Decode-oriented (weights stream once from HBM):
// - the MMA is swapped, D^T = W x^T: 16 weight rows are the m16 side of mma.m16n8k16 (bf16),
//   8 tokens the n8 side, so M = 1..8 wastes nothing on the weight side;
// - every lane loads 16 bytes of weights (32 values, one scale block per row) per 64-K chunk
//   with L1-bypassing streaming loads, from a ring of U chunks (weights, scales and the matching
//   activations) kept in flight per warp;
// - dequantization is exact in registers: mask/shift to bf16 bits, one bf16x2 multiply by the
//   block scale; the global scale is applied to the fp32 result;
// - warp-level stream-K: the tiles are one flat stream of 512-byte chunks in (row tile, chunk)
//   order; the grid is sized to the SMs of the stream's partition and every warp takes an equal
//   contiguous range, so all warps finish together whatever N and K are. A row tile split
//   between warps is fixed up by the last warp to finish it, which adds the partial sums in warp
//   order (deterministic) and writes the output; a tile a warp owns alone is written directly;
// - any M: grid.y walks blocks of 8*MB tokens (weights are re-read per block).
#include <cuda_bf16.h>

#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda::detail {
namespace {

// The loads are volatile asm so that the compiler keeps them where the ring issues them (U chunks
// ahead of their use) instead of sinking them next to the use.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 ld_act(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ld_scale(const uint16_t* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  const uint32_t neg_zero = 0x80008000u;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(neg_zero));
  return d;
}

// Four bf16x2 registers (pairs p = 0..3 of one word, bit placement in nvfp4_layout.h), already
// multiplied by the block scale. Pairs 0-2 take one shift and one mask each (integer ALU
// throughput is what limits this kernel), pair 3 three of each.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t scale2, uint32_t (&r)[4]) {
  constexpr uint32_t kP = 0x81C081C0u;  // bf16 bits 15 and 8..6 of both halves
  r[0] = bf16x2_mul(w & kP, scale2);
  r[1] = bf16x2_mul((w << 3) & kP, scale2);
  r[2] = bf16x2_mul((w << 6) & kP, scale2);
  const uint32_t p3 = ((w << 1) & 0x80008000u) | ((w >> 5) & 0x01000100u) | ((w >> 4) & 0x00C000C0u);
  r[3] = bf16x2_mul(p3, scale2);
}

__device__ __forceinline__ uint32_t scale_pair(uint32_t code) {
  return code * 0x00100010u + (kNvfp4ScaleBf16Base | (kNvfp4ScaleBf16Base << 16));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm(
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

struct StreamK {
  int64_t warps;          // warps per M block (the stream-K width)
  int64_t max_segments;   // row tiles one warp can touch
  float* partials;        // [m blocks][warps][max_segments][E][32]
  unsigned* counters;     // [m blocks][row tiles], zero between launches
};

__device__ __forceinline__ int64_t warp_begin(int64_t w, int64_t total, int64_t warps) { return w * total / warps; }
__device__ __forceinline__ int64_t warp_of_chunk(int64_t f, int64_t total, int64_t warps) {
  return ((f + 1) * warps - 1) / total;
}

template <int MB, int H>
__device__ __forceinline__ void write_tile(const Nvfp4GemmArgs& a, const float (&v)[H][MB][4], int64_t rt, int64_t m0,
                                           int lane) {
  const float gs = *a.global_scale * kNvfp4AccUnscale;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int b = 0; b < MB; ++b)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t n = rt * kNvfp4TileRows + g + 8 * (r >> 1), m = m0 + 8 * b + 2 * t + (r & 1);
      if (n >= a.n || m >= a.m) continue;
      float out = v[0][b][r] * gs;
      if (H == 2) {
        const float up = v[H - 1][b][r] * gs;
        out = out / (1.f + __expf(-out)) * up;
      } else if (a.bias) {
        out += a.bias_f32 ? static_cast<const float*>(a.bias)[n]
                          : __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[n]);
      }
      if (a.y_f32) static_cast<float*>(a.y)[m * a.y_ld + n] = out;
      else static_cast<__nv_bfloat16*>(a.y)[m * a.y_ld + n] = __float2bfloat16_rn(out);
    }
}

// Stream-K bookkeeping of one row tile: which warps contribute to it.
struct TileOwners {
  int64_t first, last;
};
__device__ __forceinline__ TileOwners tile_owners(int64_t rt, int64_t C, int64_t total, int64_t warps) {
  return {warp_of_chunk(rt * C, total, warps), warp_of_chunk(rt * C + C - 1, total, warps)};
}

template <int E>
__device__ __forceinline__ float* partial_slot(const StreamK& sk, int64_t rt, int64_t ww, int64_t C, int64_t total) {
  const int64_t seg = rt - warp_begin(ww, total, sk.warps) / C;
  return sk.partials + ((static_cast<int64_t>(blockIdx.y) * sk.warps + ww) * sk.max_segments + seg) * E * 32;
}

// Stores this warp's partial sums of a shared row tile (no fence yet).
template <int MB, int H>
__device__ __forceinline__ void publish_partial(const StreamK& sk, const float (&acc)[H][MB][4], int64_t rt, int64_t w,
                                                int64_t C, int64_t total, int lane) {
  constexpr int E = H * MB * 4;
  float* mine = partial_slot<E>(sk, rt, w, C, total);
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) __stcg(mine + ((h * MB + b) * 4 + r) * 32 + lane, acc[h][b][r]);
}

// After publish + fence: counts this warp in; the last contributor adds all partial sums in
// warp order (deterministic) and writes the tile.
template <int MB, int H>
__device__ __forceinline__ void finish_if_last(const Nvfp4GemmArgs& a, const StreamK& sk, int64_t rt, int64_t C,
                                               int64_t total, int64_t m0, int lane) {
  constexpr int E = H * MB * 4;
  const TileOwners o = tile_owners(rt, C, total, sk.warps);
  unsigned* counter = sk.counters + static_cast<int64_t>(blockIdx.y) * ((a.n + kNvfp4TileRows - 1) / kNvfp4TileRows) + rt;
  unsigned old = 0;
  if (lane == 0) old = atomicAdd(counter, 1u);
  old = __shfl_sync(0xffffffffu, old, 0);
  if (old != static_cast<unsigned>(o.last - o.first)) return;
  __threadfence();
  float v[H][MB][4];
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) v[h][b][r] = 0.f;
  for (int64_t ww = o.first; ww <= o.last; ++ww) {
    const float* p = partial_slot<E>(sk, rt, ww, C, total);
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int r = 0; r < 4; ++r) v[h][b][r] += __ldcg(p + ((h * MB + b) * 4 + r) * 32 + lane);
  }
  if (lane == 0) *counter = 0;  // ready for the next launch (graph replays too)
  write_tile<MB, H>(a, v, rt, m0, lane);
}

constexpr int kWarpsPerCta = 4;

template <int MB, int U, bool SWIGLU>
__global__ void __launch_bounds__(kWarpsPerCta * 32) nvfp4_gemm_kernel(Nvfp4GemmArgs a, StreamK sk) {
  constexpr int H = SWIGLU ? 2 : 1;
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5);
  if (w >= sk.warps) return;
  const int t = lane & 3, g = lane >> 2;
  const int64_t C = a.k_chunks;
  const int64_t row_tiles = (a.n + kNvfp4TileRows - 1) / kNvfp4TileRows;
  const int64_t total = row_tiles * C;
  const int64_t f0 = warp_begin(w, total, sk.warps), f1 = warp_begin(w + 1, total, sk.warps);
  if (f0 >= f1) return;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * 8 * MB;
  const int64_t up_off = a.up_tile_offset * C;  // flat chunk offset of the up rows

  const uint16_t* xrow[MB];
  bool mrow_ok[MB];
#pragma unroll
  for (int b = 0; b < MB; ++b) {
    const int64_t m = m0 + 8 * b + g;
    mrow_ok[b] = m < a.m;
    xrow[b] = a.x + (mrow_ok[b] ? m : 0) * a.x_ld;
  }
  // Loads go strictly in chunk order, so the addresses and the chunk-in-row index advance by
  // increments (no 64-bit division in the loop: it cost more than the dequantization).
  const uint8_t* wp = a.w_tiles + (f0 * 32 + lane) * 16;
  const uint16_t* sp = a.w_scales + f0 * 32 + lane;
  const int64_t up_bytes = up_off * 512, up_scales = up_off * 32;
  int kc = static_cast<int>(f0 % C);
  const int kc_end = static_cast<int>(C);
  const int kmax = static_cast<int>(a.k);

  // Ring of U chunks in flight: weights, scales and the matching activations (the activations
  // come from L2: each SM's warps read different K ranges, so they need the same lead).
  uint4 wv[U][H];
  uint32_t sc[U][H];
  uint4 xv[U][MB][2];
  auto load_slot = [&](uint4 (&wslot)[H], uint32_t (&sslot)[H], uint4 (&xslot)[MB][2]) {
#pragma unroll
    for (int h = 0; h < H; ++h) {
      wslot[h] = ld_stream(wp + (h ? up_bytes : 0));
      sslot[h] = ld_scale(sp + (h ? up_scales : 0));
    }
    const int kb = kc * kNvfp4ChunkK + 16 * t;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      if (mrow_ok[b] && kb < kmax) {
        const uint4* p = reinterpret_cast<const uint4*>(xrow[b] + kb);
        xslot[b][0] = ld_act(p);
        xslot[b][1] = ld_act(p + 1);
      } else {
        xslot[b][0] = make_uint4(0, 0, 0, 0);
        xslot[b][1] = make_uint4(0, 0, 0, 0);
      }
    }
    wp += 512;
    sp += 32;
    if (++kc == kc_end) kc = 0;
  };
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (f0 + u < f1) {
      load_slot(wv[u], sc[u], xv[u]);
    } else {
#pragma unroll
      for (int h = 0; h < H; ++h) {
        wv[u][h] = make_uint4(0, 0, 0, 0);
        sc[u][h] = 0;
      }
#pragma unroll
      for (int b = 0; b < MB; ++b) xv[u][b][0] = xv[u][b][1] = make_uint4(0, 0, 0, 0);
    }
  }

  float acc[H][MB][4];
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[h][b][r] = 0.f;

  // Tiles this warp covers alone are written as soon as they end; a shared first tile is kept in
  // registers and published with the shared last tile at the end, so a warp fences only once.
  float acc_first[H][MB][4];
  bool first_shared = false;
  int64_t rt_first = 0;

  int64_t rt = f0 / C, c = f0 % C;
  for (int64_t f = f0; f < f1; f += U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t fi = f + u;
      if (fi < f1) {
        if (c == C) {  // crossed into the next row tile
          const TileOwners o = tile_owners(rt, C, total, sk.warps);
          if (o.first == o.last) {
            write_tile<MB, H>(a, acc, rt, m0, lane);
          } else {
            first_shared = true;
            rt_first = rt;
#pragma unroll
            for (int h = 0; h < H; ++h)
#pragma unroll
              for (int b = 0; b < MB; ++b)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc_first[h][b][r] = acc[h][b][r];
          }
#pragma unroll
          for (int h = 0; h < H; ++h)
#pragma unroll
            for (int b = 0; b < MB; ++b)
#pragma unroll
              for (int r = 0; r < 4; ++r) acc[h][b][r] = 0.f;
          ++rt;
          c = 0;
        }
#pragma unroll
        for (int h = 0; h < H; ++h) tile_mma<MB>(wv[u][h], sc[u][h], xv[u], acc[h]);
        if (fi + U < f1) load_slot(wv[u], sc[u], xv[u]);
        ++c;
      }
    }
  }
  const TileOwners o = tile_owners(rt, C, total, sk.warps);
  const bool last_shared = o.first != o.last;
  if (!last_shared) write_tile<MB, H>(a, acc, rt, m0, lane);
  else publish_partial<MB, H>(sk, acc, rt, w, C, total, lane);
  if (first_shared) publish_partial<MB, H>(sk, acc_first, rt_first, w, C, total, lane);
  if (first_shared || last_shared) {
    __threadfence();
    __syncwarp();
    if (first_shared) finish_if_last<MB, H>(a, sk, rt_first, C, total, m0, lane);
    if (last_shared) finish_if_last<MB, H>(a, sk, rt, C, total, m0, lane);
  }
}

// Per-(device, stream) stream-K scratch. Grown outside the stream order (relaxed capture mode);
// an outgrown buffer is kept alive, since a captured graph may still use it.
struct SplitScratch {
  float* partials = nullptr;
  size_t partial_cap = 0;
  unsigned* counters = nullptr;
  size_t counter_cap = 0;
};

std::mutex g_scratch_mu;

void scratch_for(cudaStream_t stream, size_t partial_floats, size_t counters, StreamK* sk) {
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
    LOCUS_CUDA_CHECK_NAMED(err, "allocating the NVFP4 stream-K scratch");
  }
  sk->partials = s.partials;
  sk->counters = s.counters;
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
  const int64_t total = row_tiles * a.k_chunks;
  // Warps per M block: exactly what the SMs hold at once (one wave, so equal ranges finish
  // together), but at least 2U chunks per warp so the ring pays off.
  static const int ctas_per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, nvfp4_gemm_kernel<MB, U, SW>, kWarpsPerCta * 32, 0) !=
            cudaSuccess ||
        n < 1) {
      cudaGetLastError();
      n = 1;
    }
    return n;
  }();
  int64_t warps = std::max<int64_t>(1, static_cast<int64_t>(ctas_per_sm) * kWarpsPerCta * sms / m_blocks);
  warps = std::min<int64_t>(warps, std::max<int64_t>(1, total / (2 * U)));
  StreamK sk{};
  sk.warps = warps;
  const int64_t per_warp = (total + warps - 1) / warps;
  sk.max_segments = per_warp / a.k_chunks + 2;
  constexpr int E = (SW ? 2 : 1) * MB * 4;
  scratch_for(stream, static_cast<size_t>(m_blocks * warps * sk.max_segments * E * 32),
              static_cast<size_t>(m_blocks * row_tiles), &sk);
  dim3 grid(static_cast<unsigned>((warps + kWarpsPerCta - 1) / kWarpsPerCta), static_cast<unsigned>(m_blocks));
  nvfp4_gemm_kernel<MB, U, SW><<<grid, kWarpsPerCta * 32, 0, stream>>>(a, sk);
  LOCUS_CUDA_CHECK_LAUNCH("NVFP4 GEMM kernel launch");
}

template <bool SW>
void launch_for_m(const Nvfp4GemmArgs& a, int64_t row_tiles, cudaStream_t stream) {
  if (a.m <= 8) launch_cfg<1, 8, SW>(a, row_tiles, (a.m + 7) / 8, stream);
  else if (a.m <= 16) launch_cfg<2, 4, SW>(a, row_tiles, (a.m + 15) / 16, stream);
  else launch_cfg<4, 2, SW>(a, row_tiles, (a.m + 31) / 32, stream);
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
