// The weight-streaming skinny GEMM and its locality-domain form (stream_gemm.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/persistent_alloc.h"
#include "backends/cuda/stream_gemm.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda::detail {
namespace {

constexpr int kWarps = 8;  // per CTA; warps work independently
constexpr unsigned kFull = 0xFFFFFFFFu;

// Per-launch constants computed on the host.
struct Plan {
  int32_t chunks;   // K chunks per tile-half
  int32_t splits;   // S: units per tile-half
  int32_t units[kStreamGemmMaxDomains];  // queue length per domain
  unsigned* counters;  // [kStreamGemmMaxDomains unit counters][done][tile counters...]
  float4* partials;    // [slot][MB][32 lanes]
  int32_t total_warps;
};

constexpr int kDoneCounter = kStreamGemmMaxDomains;
constexpr int kTileCounters = kStreamGemmMaxDomains + 1;

template <StreamWeight F>
struct Format;

// NVFP4: a chunk is 16 rows x 64 K of one tile = 512 bytes, 16 per lane, plus the lane's two
// scale codes; the lane's activations are its token's 16 K values (one scale block).
template <>
struct Format<StreamWeight::kNVFP4> {
  static constexpr int kChunkK = 64;
  struct Stage {
    uint4 w;
    uint32_t s;
  };
  struct Cursor {
    const uint8_t* w;
    const uint16_t* s;
  };
  template <int MB>
  using XFrag = uint4[MB][2];

  __device__ static Cursor start(const StreamGemmPart& p, int32_t chunks, int, int tile, int half, int c0, int lane) {
    const int64_t t = (static_cast<int64_t>(tile) + half * p.up_offset) * chunks + c0;
    return {static_cast<const uint8_t*>(p.w) + (t * 32 + lane) * 16, p.scales + t * 32 + lane};
  }
  __device__ static void load(Stage& st, const Cursor& c, int j, int64_t, int, int) {
    st.w = __ldcs(reinterpret_cast<const uint4*>(c.w + static_cast<int64_t>(j) * 512));
    st.s = c.s[static_cast<int64_t>(j) * 32];
  }
  template <int MB>
  __device__ static void load_x(uint4 (&xv)[MB][2], const StreamGemmArgs& a, const uint16_t* x, int c, int g, int t) {
    const int64_t kb = static_cast<int64_t>(c) * kChunkK + 16 * t;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int m = 8 * b + g;
      if (m < a.m && kb < a.k) {
        const uint4* p = reinterpret_cast<const uint4*>(x + m * a.x_ld + kb);
        xv[b][0] = __ldg(p);
        xv[b][1] = __ldg(p + 1);
      } else {
        xv[b][0] = make_uint4(0, 0, 0, 0);
        xv[b][1] = make_uint4(0, 0, 0, 0);
      }
    }
  }
  template <int MB>
  __device__ static void mma(const Stage& st, const uint4 (&xv)[MB][2], float (&acc)[MB][4]) {
    nvfp4_chunk_mma<MB>(st.w, st.s, xv, acc);
  }
  __device__ static float out_scale(const StreamGemmPart& p) { return *p.global_scale * kNvfp4AccUnscale; }
};

// BF16: a chunk is 16 rows x 32 K of the row-major weight: each lane loads 8 K values (16 bytes)
// of row g and of row g + 8; its activations are its token's same 8 K values.
template <>
struct Format<StreamWeight::kBF16> {
  static constexpr int kChunkK = 32;
  struct Stage {
    uint4 lo, hi;
  };
  struct Cursor {
    const uint16_t* lo;
    const uint16_t* hi;
    int64_t k0;  // K of the lane's first value in chunk 0 of the unit
  };
  template <int MB>
  using XFrag = uint4[MB];

  __device__ static Cursor start(const StreamGemmPart& p, int32_t, int batch, int tile, int half, int c0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    // Rows past the part's end read its last row (valid memory); their outputs are dropped.
    const int64_t r_lo = min(tile * 16 + g, p.rows - 1) + half * p.up_offset;
    const int64_t r_hi = min(tile * 16 + g + 8, p.rows - 1) + half * p.up_offset;
    const int64_t k0 = static_cast<int64_t>(c0) * kChunkK + 8 * t;
    const auto* w = static_cast<const uint16_t*>(p.w) + batch * p.w_batch_stride;
    return {w + r_lo * p.ldw + k0, w + r_hi * p.ldw + k0, k0};
  }
  __device__ static void load(Stage& st, const Cursor& c, int j, int64_t k, int, int) {
    if (c.k0 + static_cast<int64_t>(j) * kChunkK < k) {
      st.lo = __ldcs(reinterpret_cast<const uint4*>(c.lo + j * kChunkK));
      st.hi = __ldcs(reinterpret_cast<const uint4*>(c.hi + j * kChunkK));
    } else {
      st.lo = make_uint4(0, 0, 0, 0);
      st.hi = make_uint4(0, 0, 0, 0);
    }
  }
  template <int MB>
  __device__ static void load_x(uint4 (&xv)[MB], const StreamGemmArgs& a, const uint16_t* x, int c, int g, int t) {
    const int64_t kb = static_cast<int64_t>(c) * kChunkK + 8 * t;
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const int m = 8 * b + g;
      xv[b] = (m < a.m && kb < a.k) ? __ldg(reinterpret_cast<const uint4*>(x + m * a.x_ld + kb))
                                    : make_uint4(0, 0, 0, 0);
    }
  }
  template <int MB>
  __device__ static void mma(const Stage& st, const uint4 (&xv)[MB], float (&acc)[MB][4]) {
    bf16_chunk_mma<MB>(st.lo, st.hi, xv, acc);
  }
  __device__ static float out_scale(const StreamGemmPart&) { return 1.f; }
};

// Chunks in flight per warp: enough bytes to cover the memory latency within the register budget.
// (Within 128 registers, the budget for two CTAs per SM: checked with nvcc -Xptxas -v, no spills.)
template <StreamWeight F, int MB>
constexpr int pipeline_depth() {
  if (MB >= 4) return 2;
  return F == StreamWeight::kNVFP4 && MB == 1 ? 8 : 4;
}

// Streams chunks [c0, c1) of one tile-half of batch entry `batch` through the register pipeline into acc.
template <StreamWeight F, int MB>
__device__ __forceinline__ void run_unit(const StreamGemmArgs& a, const StreamGemmPart& p, int32_t chunks, int batch,
                                         int tile, int half, int c0, int c1, int lane, float (&acc)[MB][4]) {
  using Fmt = Format<F>;
  constexpr int U = pipeline_depth<F, MB>();
  static_assert(U % 2 == 0, "the activation double buffer alternates with the pipeline slot");
  const int g = lane >> 2, t = lane & 3;
  const int n = c1 - c0;
  const typename Fmt::Cursor cur = Fmt::start(p, chunks, batch, tile, half, c0, lane);
  const uint16_t* x = (p.x ? p.x : a.x) + batch * p.x_batch_stride;
  typename Fmt::Stage st[U];
#pragma unroll
  for (int j = 0; j < U; ++j)
    if (j < n) Fmt::load(st[j], cur, j, a.k, g, t);
  // Activations (L1/L2 hits) one chunk ahead, except for MB = 4, where two buffers would spill.
  constexpr bool kPrefetchX = MB < 4;
  typename Fmt::template XFrag<MB> xv[kPrefetchX ? 2 : 1];
  if (kPrefetchX) Fmt::template load_x<MB>(xv[0], a, x, c0, g, t);
  for (int i = 0; i < n; i += U) {
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int idx = i + j;
      if (idx < n) {
        const int xb = kPrefetchX ? (j & 1) : 0;
        if (kPrefetchX && idx + 1 < n) Fmt::template load_x<MB>(xv[(j + 1) & 1], a, x, c0 + idx + 1, g, t);
        if (!kPrefetchX) Fmt::template load_x<MB>(xv[0], a, x, c0 + idx, g, t);
        Fmt::template mma<MB>(st[j], xv[xb], acc);
        if (idx + U < n) Fmt::load(st[j], cur, idx + U, a.k, g, t);
      }
    }
  }
}

__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

// Writes the outputs of one finished tile: v[h] holds the tile's (gate, up) sums in C-fragment order.
template <StreamWeight F, int MB, int H>
__device__ __forceinline__ void store_tile(const StreamGemmArgs& a, const StreamGemmPart& p, int batch, int tile,
                                           int lane, const float (&v)[H][MB][4]) {
  const int g = lane >> 2, t = lane & 3;
  const float scale = Format<F>::out_scale(p);
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

// Takes the next unit: own domain first, then the others in order. Lane 0 does the atomics.
__device__ __forceinline__ bool grab_unit(const Plan& pl, int num_domains, int home, unsigned& exhausted, int& domain,
                                          int& unit, int lane) {
  for (int i = 0; i < num_domains; ++i) {
    int d = home + i;
    if (d >= num_domains) d -= num_domains;
    if ((exhausted >> d) & 1u) continue;
    unsigned u = 0;
    if (lane == 0) u = atomicAdd(pl.counters + d, 1u);
    u = __shfl_sync(kFull, u, 0);
    if (u < static_cast<unsigned>(pl.units[d])) {
      domain = d;
      unit = static_cast<int>(u);
      return true;
    }
    exhausted |= 1u << d;
  }
  return false;
}

template <StreamWeight F, int MB, int H>
__global__ void __launch_bounds__(kWarps * 32, 2) stream_gemm_kernel(const __grid_constant__ StreamGemmArgs a,
                                                                      const __grid_constant__ Plan pl) {
  const int lane = threadIdx.x & 31;
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  int home = 0;
  if (a.sm_domain != nullptr) {
    const uint8_t d = smid < 1024 ? a.sm_domain[smid] : kNoDomain;
    home = d < a.num_domains ? d : static_cast<int>(smid % a.num_domains);
  }
  const int units_per_tile = H * pl.splits;
  unsigned exhausted = 0;
  int domain = 0, unit = 0;
  while (grab_unit(pl, a.num_domains, home, exhausted, domain, unit, lane)) {
    // The part of `domain` that holds `unit`.
    int pi = 0;
    for (int q = 0; q < a.num_parts; ++q) {
      const StreamGemmPart& cand = a.parts[q];
      if (cand.domain == domain && unit >= cand.unit_begin &&
          unit < cand.unit_begin + cand.batch * cand.tiles * units_per_tile) {
        pi = q;
        break;
      }
    }
    const StreamGemmPart& p = a.parts[pi];
    // Units are split-major: consecutive units share a K range (and so the activations in L1).
    const int local = unit - p.unit_begin;
    const int tile_halves = p.batch * p.tiles * H;
    const int s = local / tile_halves;
    const int batch_tile = (local % tile_halves) / H;  // batch entry * tiles + tile
    const int batch = batch_tile / p.tiles, tile = batch_tile % p.tiles;
    const int half = local % H;
    const int c0 = static_cast<int>(static_cast<int64_t>(pl.chunks) * s / pl.splits);
    const int c1 = static_cast<int>(static_cast<int64_t>(pl.chunks) * (s + 1) / pl.splits);

    float acc[MB][4];
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[b][r] = 0.f;
    run_unit<F, MB>(a, p, pl.chunks, batch, tile, half, c0, c1, lane, acc);

    if (units_per_tile == 1) {
      const float(&v)[1][MB][4] = reinterpret_cast<const float(&)[1][MB][4]>(acc);
      store_tile<F, MB, 1>(a, p, batch, tile, lane, v);
      continue;
    }
    // Partial tile out; the tile's last unit adds all of them in unit order.
    const int64_t tile_slot0 = p.partial_base + static_cast<int64_t>(batch_tile) * units_per_tile;
    float4* mine = pl.partials + ((tile_slot0 + half * pl.splits + s) * MB) * 32;
#pragma unroll
    for (int b = 0; b < MB; ++b) __stcg(mine + b * 32 + lane, make_float4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]));
    __threadfence();
    __syncwarp();
    unsigned* tile_counter = pl.counters + kTileCounters + p.tile_base + batch_tile;
    unsigned arrived = 0;
    if (lane == 0) arrived = atomicAdd(tile_counter, 1u);
    arrived = __shfl_sync(kFull, arrived, 0);
    if (arrived != static_cast<unsigned>(units_per_tile - 1)) continue;
    __threadfence();
    float v[H][MB][4];
#pragma unroll
    for (int h = 0; h < H; ++h) {
#pragma unroll
      for (int b = 0; b < MB; ++b)
#pragma unroll
        for (int r = 0; r < 4; ++r) v[h][b][r] = 0.f;
      for (int s2 = 0; s2 < pl.splits; ++s2) {
        const float4* src = pl.partials + ((tile_slot0 + h * pl.splits + s2) * MB) * 32;
#pragma unroll
        for (int b = 0; b < MB; ++b) {
          const float4 f = __ldcg(src + b * 32 + lane);
          v[h][b][0] += f.x;
          v[h][b][1] += f.y;
          v[h][b][2] += f.z;
          v[h][b][3] += f.w;
        }
      }
    }
    store_tile<F, MB, H>(a, p, batch, tile, lane, v);
    if (lane == 0) *tile_counter = 0;  // ready for the next launch (graph replays too)
  }
  // The last warp out resets the unit counters for the next launch.
  if (lane == 0) {
    __threadfence();
    if (atomicAdd(pl.counters + kDoneCounter, 1u) == static_cast<unsigned>(pl.total_warps - 1)) {
      for (int d = 0; d < kStreamGemmMaxDomains; ++d) pl.counters[d] = 0;
      pl.counters[kDoneCounter] = 0;
      __threadfence();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// host side

// Per-(device, stream) counters and partial tiles, grown on demand (persistent_alloc.h: an
// outgrown buffer is kept alive, since a captured graph may still use it).
struct Scratch {
  unsigned* counters = nullptr;
  size_t counter_cap = 0;
  float4* partials = nullptr;
  size_t partial_cap = 0;
};

Scratch scratch_for(cudaStream_t stream, size_t counters, size_t partials) {
  static std::mutex mu;
  static auto* all = new std::map<std::pair<int, cudaStream_t>, Scratch>();
  std::lock_guard<std::mutex> lock(mu);
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  Scratch& s = (*all)[{dev, stream}];
  if (s.partial_cap < partials) {
    const size_t cap = std::max(partials, 2 * s.partial_cap);
    // Partials are written before they are read; they need no initialization (zeroed anyway).
    s.partials = static_cast<float4*>(persistent_device_alloc(cap * sizeof(float4), nullptr, "allocating the streaming GEMM partials"));
    s.partial_cap = cap;
  }
  if (s.counter_cap < counters) {
    const size_t cap = std::max(counters, 2 * s.counter_cap);
    s.counters = static_cast<unsigned*>(persistent_device_alloc(cap * sizeof(unsigned), nullptr, "allocating the streaming GEMM counters"));
    s.counter_cap = cap;
  }
  return s;
}

int sm_count_for(cudaStream_t stream) {
  const int part = partition_stream_sm_count(stream);
  if (part > 0) return part;
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  return sms;
}

std::atomic<int> g_units_per_warp{0};

template <StreamWeight F, int MB, int H>
void launch_typed(StreamGemmArgs& a, cudaStream_t stream) {
  auto* kernel = stream_gemm_kernel<F, MB, H>;
  static const int blocks_per_sm = [&] {
    int n = 0;
    LOCUS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarps * 32, 0));
    return std::max(n, 1);
  }();
  const int max_blocks = blocks_per_sm * sm_count_for(stream);
  const int32_t chunks = static_cast<int32_t>((a.k + Format<F>::kChunkK - 1) / Format<F>::kChunkK);

  int64_t tile_halves = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    a.parts[i].tiles = (a.parts[i].rows + 15) / 16;
    tile_halves += static_cast<int64_t>(a.parts[i].batch) * a.parts[i].tiles * H;
  }
  // S: a few units per resident warp; every unit at least one chunk.
  const int upw = g_units_per_warp.load() > 0 ? g_units_per_warp.load() : 2;
  const int64_t target_units = static_cast<int64_t>(max_blocks) * kWarps * upw;
  int64_t splits = (target_units + tile_halves / 2) / std::max<int64_t>(tile_halves, 1);
  splits = std::clamp<int64_t>(splits, 1, chunks);

  Plan pl{};
  pl.chunks = chunks;
  pl.splits = static_cast<int32_t>(splits);
  int64_t tiles_total = 0, slots_total = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    StreamGemmPart& p = a.parts[i];
    p.unit_begin = pl.units[p.domain];
    const int64_t units = static_cast<int64_t>(p.batch) * p.tiles * H * splits;
    LOCUS_CHECK(pl.units[p.domain] + units < (1LL << 30), "streaming GEMM: too many work units");
    pl.units[p.domain] += static_cast<int32_t>(units);
    p.tile_base = static_cast<int32_t>(tiles_total);
    tiles_total += static_cast<int64_t>(p.batch) * p.tiles;
    p.partial_base = slots_total;
    if (H * splits > 1) slots_total += units;
  }
  int64_t all_units = 0;
  for (int d = 0; d < a.num_domains; ++d) all_units += pl.units[d];
  const int blocks = static_cast<int>(std::min<int64_t>(max_blocks, (all_units + kWarps - 1) / kWarps));
  pl.total_warps = blocks * kWarps;
  Scratch s = scratch_for(stream, kTileCounters + static_cast<size_t>(tiles_total),
                          std::max<size_t>(1, static_cast<size_t>(slots_total) * MB * 32));
  pl.counters = s.counters;
  pl.partials = s.partials;
  stream_gemm_kernel<F, MB, H><<<blocks, kWarps * 32, 0, stream>>>(a, pl);
  LOCUS_CUDA_CHECK_LAUNCH("streaming GEMM kernel launch");
}

template <StreamWeight F, int H>
void launch_for_m(StreamGemmArgs& a, cudaStream_t stream) {
  if (a.m <= 8) launch_typed<F, 1, H>(a, stream);
  else if (a.m <= 16) launch_typed<F, 2, H>(a, stream);
  else launch_typed<F, 4, H>(a, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void set_stream_gemm_tuning(const StreamGemmTuning& t) { g_units_per_warp.store(t.units_per_warp); }

bool stream_gemm_eligible(const StreamGemmArgs& a) {
  if (a.m < 1 || a.m > kStreamGemmMaxM || a.k < 1) return false;
  if (!aligned16(a.x) || a.x_ld % 8 != 0) return false;
  if (a.y_ld < 0) return false;
  for (int i = 0; i < a.num_parts; ++i) {
    const StreamGemmPart& p = a.parts[i];
    if (p.x && !aligned16(p.x)) return false;
    if (p.x_batch_stride % 8 != 0) return false;
  }
  if (a.format == StreamWeight::kBF16) {
    if (a.k % 8 != 0) return false;
    for (int i = 0; i < a.num_parts; ++i) {
      const StreamGemmPart& p = a.parts[i];
      if (!aligned16(p.w) || p.ldw % 8 != 0 || p.w_batch_stride % 8 != 0) return false;
    }
  } else {
    if (a.k % 16 != 0) return false;
  }
  return true;
}

void launch_stream_gemm(StreamGemmArgs& a, cudaStream_t stream) {
  LOCUS_CHECK(stream_gemm_eligible(a), "streaming GEMM: ineligible problem (M = ", a.m, ", K = ", a.k,
              "; needs 1 <= M <= ", kStreamGemmMaxM, " and 16-byte aligned rows)");
  LOCUS_CHECK(a.num_parts >= 1 && a.num_parts <= kStreamGemmMaxParts, "streaming GEMM: ", a.num_parts,
              " weight parts (1..", kStreamGemmMaxParts, ")");
  LOCUS_CHECK(a.num_domains >= 1 && a.num_domains <= kStreamGemmMaxDomains, "streaming GEMM: ", a.num_domains,
              " domains (1..", kStreamGemmMaxDomains, ")");
  for (int i = 0; i < a.num_parts; ++i) {
    const StreamGemmPart& p = a.parts[i];
    LOCUS_CHECK(p.w != nullptr && p.rows >= 1 && p.batch >= 1 && p.y_offset >= 0 && p.domain >= 0 &&
                    p.domain < a.num_domains,
                "streaming GEMM: part ", i, " is malformed (rows ", p.rows, ", batch ", p.batch, ", domain ", p.domain,
                ")");
    LOCUS_CHECK(p.batch == 1 || a.format == StreamWeight::kBF16, "streaming GEMM: batched NVFP4 parts are not supported");
    LOCUS_CHECK(a.format == StreamWeight::kBF16 || (p.scales != nullptr && p.global_scale != nullptr),
                "streaming GEMM: NVFP4 part ", i, " has no scales");
  }
  if (a.format == StreamWeight::kNVFP4) {
    a.swiglu ? launch_for_m<StreamWeight::kNVFP4, 2>(a, stream) : launch_for_m<StreamWeight::kNVFP4, 1>(a, stream);
  } else {
    a.swiglu ? launch_for_m<StreamWeight::kBF16, 2>(a, stream) : launch_for_m<StreamWeight::kBF16, 1>(a, stream);
  }
}

}  // namespace locus::cuda::detail
