// The NVFP4 matrix-vector kernel for decode (nvfp4_gemv.h).
//
// A slot is TW row tiles (16 rows each; with SwiGLU a gate tile and its up tile) that one warp
// streams side by side, so that its activation loads serve them all. A CTA of 8 warps holds
// 8 / W slots; the W warps of a slot split its 64-K chunks into contiguous parts. Each lane
// loads, per chunk and tile, its 16 bytes of codes and its 2 scale bytes (the layout's A-fragment
// order, nvfp4_layout.h) straight into registers, U chunks a batch with the next batch in flight,
// and multiplies them with its token's 16 K values of the chunk (mma_fragments.cuh). The warps'
// C fragments are added in warp order in shared memory and the outputs written once.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/cuda/bf16_gemv_device.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/grid_dependency.cuh"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/stream_epilogue.cuh"
#include "backends/cuda/stream_registry.h"
#include "backends/cuda/stream_scratch.h"
#include "core/error.h"

namespace locus::cuda::detail {
namespace {

EnvToggle g_enabled{"LOCUS_NVFP4_GEMV", true};
Nvfp4GemvShape g_forced{0, 0};

constexpr int kWarps = 8, kThreads = 32 * kWarps;
// From chunk c of a tile to chunk c + 1 (group-major layout): 4 tiles of 512 code bytes, of 32
// scale codes.
constexpr int kCodeChunkStride = kNvfp4GroupTiles * kNvfp4TileBytes / 16;  // in uint4
constexpr int kScaleChunkStride = kNvfp4GroupTiles * 32;                   // in uint16

// A lane's two scale codes of a tile chunk: read once, so they bypass L1 like the codes.
__device__ __forceinline__ uint32_t load_scale_streamed(const uint16_t* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// What one CTA computes: a weight times its activation rows into its output rows.
struct Problem {
  const uint8_t* codes;
  const uint16_t* scales;
  const float* global_scale;  // nullptr: outputs of zero (a by-id entry's id out of range)
  const uint16_t* x;
  int64_t x_ld;
  int m;
  int64_t y_offset;  // elements from Nvfp4GemvArgs::y to output row 0, column 0
};

// MB blocks of 8 tokens, TW tiles a slot, W warps a slot, SwiGLU (TW == 2: gate and up tile),
// by-id products (blockIdx.z the product, blockIdx.y its entry). Three CTAs an SM where one tile
// and one block of tokens leave the registers for it (80 a thread), else two.
template <int MB, int TW, int W, bool SWIGLU, bool INDEXED>
__global__ void __launch_bounds__(kThreads, MB * TW == 1 ? 3 : 2) nvfp4_gemv_kernel(Nvfp4GemvArgs a) {
  static_assert(!SWIGLU || TW == 2, "SwiGLU pairs a gate tile with its up tile");
  static_assert(!INDEXED || MB == 1, "a by-id entry is one token");
  constexpr int R = kWarps / W;            // slots a CTA
  constexpr int U = TW * MB == 1 ? 4 : 2;  // chunks a batch: fewer where registers run short
  constexpr int kOutTiles = SWIGLU ? 1 : TW;
  __shared__ float4 partial[kWarps][TW][MB][32];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t out_tiles = (a.n + 15) / 16;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * R + warp / W;
  const int chunks = static_cast<int>((a.k + 63) / 64);
  const int part = warp % W;
  const int c_begin = chunks * part / W;
  int c_end = chunks * (part + 1) / W;

  Problem pr{a.codes, a.scales, a.global_scale, a.x, a.x_ld, static_cast<int>(a.m), 0};
  if constexpr (INDEXED) {
    // Which weight an entry streams is known only once the kernel before (the routing) is done.
    launch_dependents();
    wait_for_previous_grid();
    const Nvfp4GemvIndexed& ip = a.indexed[blockIdx.z];
    const int entry = static_cast<int>(blockIdx.y);
    if (entry >= ip.entries) return;  // the whole CTA: a product with fewer entries than the grid
    const int32_t id = ip.ids[entry];
    const bool valid = id >= 0 && id < ip.count;
    const StreamWeightRef w = ip.table[valid ? id : 0];
    pr = {static_cast<const uint8_t*>(w.w), w.scales, valid ? w.global_scale : nullptr,
          ip.x + (entry / ip.x_entry_div) * ip.x_ld, 0, 1, ip.y_offset + entry * ip.y_ld};
    if (!valid) c_end = c_begin;  // nothing streamed: its sums stay zero
  }

  bool has[TW];
  const uint4* wp[TW];
  const uint16_t* sp[TW];
#pragma unroll
  for (int j = 0; j < TW; ++j) {
    const int64_t tile = SWIGLU ? slot + j * out_tiles : slot * TW + j;
    has[j] = (SWIGLU ? slot : tile) < out_tiles;
    const int64_t at = nvfp4_tile_index(has[j] ? tile : 0, c_begin, chunks) * 32 + lane;
    wp[j] = reinterpret_cast<const uint4*>(pr.codes) + at;
    sp[j] = pr.scales + at;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  struct Batch {  // a lane's codes and scale codes of U chunks of each tile
    uint4 w[TW][U];
    uint32_t s[TW][U];
  };
  // Loads chunks c .. c + U - 1 into `dst` (kFull: all are before c_end; else only those that
  // are) and moves the pointers past them.
  auto load_batch = [&](auto full, int c, Batch& dst) {
    constexpr bool kFull = decltype(full)::value;
#pragma unroll
    for (int j = 0; j < TW; ++j) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool ok = kFull || (has[j] && c + u < c_end);
        dst.w[j][u] = ok ? gemv_load_streamed(wp[j] + u * kCodeChunkStride) : zero;
        dst.s[j][u] = ok ? load_scale_streamed(sp[j] + u * kScaleChunkStride) : 0u;
      }
      wp[j] += U * kCodeChunkStride;
      sp[j] += U * kScaleChunkStride;
    }
  };

  Batch even, odd;  // batches alternate between them (no register copies)
  load_batch(std::false_type{}, c_begin, even);
  if constexpr (!INDEXED) {
    // The weights do not depend on the kernel before; the activations and y do.
    launch_dependents();
    wait_for_previous_grid();
  }

  // Lane (g, t) multiplies token 8b + g's K values 64c + 16t .. + 15. Lanes of tokens past M read
  // token M - 1: their products land in output columns that are never stored.
  const uint16_t* x_lane[MB];
#pragma unroll
  for (int b = 0; b < MB; ++b) x_lane[b] = pr.x + min(8 * b + g, pr.m - 1) * pr.x_ld + 16 * t;
  // The lane's chunks with activations: K is a multiple of 16, so a lane's 16 values are all in
  // or all past it.
  const int x_end = min(c_end, static_cast<int>((a.k - 16 * t + 63) / 64));
  float acc[TW][MB][4];
#pragma unroll
  for (int j = 0; j < TW; ++j)
#pragma unroll
    for (int b = 0; b < MB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][b][r] = 0.f;

  // Batch c (in `cur`): its activations loaded, the next batch's weights asked for (into `next`),
  // then the products. kFull: both batches are whole and every activation exists (no predicates).
  auto step = [&](auto full, int c, const Batch& cur, Batch& next) {
    constexpr bool kFull = decltype(full)::value;
    uint4 xv[U][MB][2];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int b = 0; b < MB; ++b) {
        const bool ok = kFull || c + u < x_end;
        const uint4* xp = reinterpret_cast<const uint4*>(x_lane[b] + 64 * (c + u));
        xv[u][b][0] = ok ? __ldg(xp) : zero;
        xv[u][b][1] = ok ? __ldg(xp + 1) : zero;
      }
    load_batch(full, c + U, next);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < TW; ++j) nvfp4_chunk_mma<MB>(cur.w[j][u], cur.s[j][u], xv[u], acc[j]);
  };
  int c = c_begin;
  const bool tiles_whole = SWIGLU ? has[0] : has[TW - 1];
  if (tiles_whole) {
    for (; c + 3 * U <= x_end; c += 2 * U) {
      step(std::true_type{}, c, even, odd);
      step(std::true_type{}, c + U, odd, even);
    }
  }
  for (; c < c_end; c += 2 * U) {
    step(std::false_type{}, c, even, odd);
    if (c + U < c_end) step(std::false_type{}, c + U, odd, even);
  }

#pragma unroll
  for (int j = 0; j < TW; ++j)
#pragma unroll
    for (int b = 0; b < MB; ++b) partial[warp][j][b][lane] = make_float4(acc[j][b][0], acc[j][b][1], acc[j][b][2], acc[j][b][3]);
  __syncthreads();

  // Outputs token-major, columns consecutive within a token (coalesced stores).
  const float scale = pr.global_scale != nullptr ? *pr.global_scale * kNvfp4AccUnscale : 0.f;
  const float* sums = reinterpret_cast<const float*>(partial);
  constexpr int kCtaCols = R * kOutTiles * 16;
  for (int o = threadIdx.x; o < kCtaCols * pr.m; o += kThreads) {
    const int m = o / kCtaCols, in_cta = o % kCtaCols;
    const int s = in_cta / (kOutTiles * 16), j = (in_cta / 16) % kOutTiles, r = in_cta % 16;
    const int64_t col = ((static_cast<int64_t>(blockIdx.x) * R + s) * kOutTiles + j) * 16 + r;
    if (col >= a.n) continue;
    // C fragment: lane 4g + t holds rows g, g + 8 and tokens 2t, 2t + 1 of its block of 8.
    const int b = m >> 3, at_lane = 4 * (r & 7) + ((m & 7) >> 1), reg = 2 * (r >> 3) + (m & 1);
    auto sum_of = [&](int tile) {
      auto at = [&](int p) { return sums[((((s * W + p) * TW + tile) * MB + b) * 32 + at_lane) * 4 + reg]; };
      float v = at(0);
#pragma unroll
      for (int p = 1; p < W; ++p) v += at(p);
      return v * scale;
    };
    float out;
    if constexpr (SWIGLU) {
      out = silu(sum_of(0)) * sum_of(1);
    } else {
      out = sum_of(j);
      if (a.bias != nullptr)
        out += a.bias_f32 ? static_cast<const float*>(a.bias)[col]
                          : __bfloat162float(static_cast<const __nv_bfloat16*>(a.bias)[col]);
    }
    const int64_t y_at = pr.y_offset + m * a.y_ld + col;
    if (a.y_f32) static_cast<float*>(a.y)[y_at] = out;
    else static_cast<__nv_bfloat16*>(a.y)[y_at] = __float2bfloat16_rn(out);
  }
}

// Blocks of 8 tokens the kernel multiplies (MB; a by-id entry is one token).
int token_blocks(const Nvfp4GemvArgs& a) { return a.num_indexed > 0 || a.m <= 8 ? 1 : 2; }

// Slots (one warp's tiles) of one weight: its output tiles, `tiles_per_warp` a slot (SwiGLU: an
// output tile's gate and up tiles).
int64_t slots_per_weight(const Nvfp4GemvArgs& a, int tiles_per_warp) {
  const int64_t out_tiles = (a.n + 15) / 16;
  return a.swiglu ? out_tiles : (out_tiles + tiles_per_warp - 1) / tiles_per_warp;
}

// Calls launch.template operator()<MB, TW, W, SWIGLU, INDEXED>() for the problem's block shape
// (by-id products: one token an entry, MB = 1).
template <class Launch>
void dispatch_nvfp4_gemv(int mb, int tw, int w, bool swiglu, bool indexed, Launch&& launch) {
  auto with_w = [&]<int MB, int TW, bool SW, bool IX>() {
    switch (w) {
      case 1: launch.template operator()<MB, TW, 1, SW, IX>(); break;
      case 2: launch.template operator()<MB, TW, 2, SW, IX>(); break;
      case 4: launch.template operator()<MB, TW, 4, SW, IX>(); break;
      default: launch.template operator()<MB, TW, 8, SW, IX>(); break;
    }
  };
  auto with_tiles = [&]<int MB, bool IX>() {
    if (swiglu) with_w.template operator()<MB, 2, true, IX>();
    else if (tw == 2) with_w.template operator()<MB, 2, false, IX>();
    else with_w.template operator()<MB, 1, false, IX>();
  };
  if (indexed) with_tiles.template operator()<1, true>();
  else if (mb == 1) with_tiles.template operator()<1, false>();
  else with_tiles.template operator()<2, false>();
}

}  // namespace

bool nvfp4_gemv_eligible(const Nvfp4GemvArgs& a) {
  const bool common = a.n >= 1 && a.k >= 16 && a.k % 16 == 0 && a.y_ld >= 0 &&
                      (!a.swiglu || (a.n % 16 == 0 && a.bias == nullptr)) && a.n <= (int64_t{1} << 31) - 64;
  if (!common) return false;
  if (a.num_indexed == 0)
    return a.m >= 1 && a.m <= kNvfp4GemvMaxM && a.x_ld % 8 == 0 && aligned16(a.x) && aligned16(a.codes) &&
           a.scales != nullptr && a.global_scale != nullptr;
  if (a.num_indexed > kNvfp4GemvMaxProducts || a.bias != nullptr) return false;
  for (int i = 0; i < a.num_indexed; ++i) {
    const Nvfp4GemvIndexed& p = a.indexed[i];
    if (p.table == nullptr || p.ids == nullptr || p.count < 1 || p.entries < 1 || p.entries > 65535 ||
        p.x_entry_div < 1 || !aligned16(p.x) || p.x_ld % 8 != 0 || p.y_offset < 0 || p.y_ld < 0)
      return false;
  }
  return true;
}

namespace {

// CTAs of the kernel resident on one SM: what its launch bounds promise.
int resident_ctas_per_sm(const Nvfp4GemvArgs& a, int tiles_per_warp) {
  return token_blocks(a) * tiles_per_warp == 1 ? 3 : 2;
}

// Slots (one warp's tiles) of the whole launch, every by-id entry's included.
int64_t slots_of(const Nvfp4GemvArgs& a, int tiles_per_warp) {
  int64_t entries = 1;
  if (a.num_indexed > 0) {
    entries = 0;
    for (int i = 0; i < a.num_indexed; ++i) entries += a.indexed[i].entries;
  }
  return slots_per_weight(a, tiles_per_warp) * entries;
}

int64_t ctas_of(const Nvfp4GemvArgs& a, Nvfp4GemvShape s) {
  const int64_t per_cta = kWarps / s.warps_per_slot;
  return (slots_of(a, s.tiles_per_warp) + per_cta - 1) / per_cta;
}

// The most warps a slot whose CTAs are all resident at once; 0 where even one warp a slot is not.
int one_wave_warps(const Nvfp4GemvArgs& a, int tiles_per_warp, int sms) {
  const int64_t chunks = (a.k + 63) / 64, resident = int64_t{resident_ctas_per_sm(a, tiles_per_warp)} * sms;
  for (int w = kWarps; w >= 1; w /= 2)
    if (w <= chunks && ctas_of(a, {tiles_per_warp, w}) <= resident) return w;
  return 0;
}

}  // namespace

Nvfp4GemvShape nvfp4_gemv_short_shape(const Nvfp4GemvArgs& a, int tiles_per_warp) {
  Nvfp4GemvShape s{tiles_per_warp, kWarps};
  const int64_t chunks = (a.k + 63) / 64, min_chunks = 8 / tiles_per_warp;
  while (s.warps_per_slot > 1 && chunks / s.warps_per_slot < min_chunks) s.warps_per_slot /= 2;
  return s;
}

Nvfp4GemvShape nvfp4_gemv_shape(const Nvfp4GemvArgs& a, int sms) {
  if (g_forced.warps_per_slot > 0)
    return {a.swiglu ? 2 : g_forced.tiles_per_warp > 0 ? g_forced.tiles_per_warp : 1, g_forced.warps_per_slot};
  const int short_tiles = a.swiglu ? 2 : 1;
  Nvfp4GemvShape best = nvfp4_gemv_short_shape(a, short_tiles);
  // How full its waves are: resident-CTA slots used over those of its whole waves.
  auto fill = [&](Nvfp4GemvShape s) {
    const double waves = double(ctas_of(a, s)) / (double(resident_ctas_per_sm(a, s.tiles_per_warp)) * sms);
    return waves / std::ceil(waves);
  };
  double best_fill = fill(best);
  // One wave of two tiles a warp at a fill no lower than the short CTAs' (it halves the
  // activation loads), then one tile a warp at a higher fill.
  for (const int tiles : {2, 1}) {
    if (a.swiglu && tiles == 1) continue;  // SwiGLU streams a gate tile with its up tile
    const int w = one_wave_warps(a, tiles, sms);
    if (w > 0 && (tiles == 2 ? fill({tiles, w}) >= best_fill : fill({tiles, w}) > best_fill))
      best = {tiles, w}, best_fill = fill(best);
  }
  return best;
}

void set_nvfp4_gemv_shape(Nvfp4GemvShape forced) { g_forced = forced; }

bool nvfp4_gemv_enabled() { return g_enabled.on(); }

std::string nvfp4_gemv_problem_key(const Nvfp4GemvArgs& a, cudaStream_t stream) {
  const int bias = a.bias == nullptr ? 0 : a.bias_f32 ? 2 : 1;
  std::string entries;  // by-id products: each one's entries
  for (int i = 0; i < a.num_indexed; ++i) entries += str(i ? "," : ":ids", a.indexed[i].entries);
  return str("nvfp4_gemv:", a.m, 'x', a.n, 'x', a.k, ':', a.x_ld, ',', a.y_ld, ':', a.y_f32, bias, a.swiglu, entries,
             ":sm", partition_stream_sm_count(stream));
}

void launch_nvfp4_gemv(const Nvfp4GemvArgs& a, cudaStream_t stream) {
  launch_nvfp4_gemv(a, nvfp4_gemv_shape(a, sm_count_for(stream)), stream);
}

void launch_nvfp4_gemv(const Nvfp4GemvArgs& a, Nvfp4GemvShape shape, cudaStream_t stream) {
  LOCUS_CHECK(nvfp4_gemv_eligible(a), "nvfp4_gemv: ineligible problem (M = ", a.m, ", N = ", a.n, ", K = ", a.k, ")");
  LOCUS_CHECK((shape.tiles_per_warp == 1 || shape.tiles_per_warp == 2) && (!a.swiglu || shape.tiles_per_warp == 2) &&
                  (shape.warps_per_slot == 1 || shape.warps_per_slot == 2 || shape.warps_per_slot == 4 ||
                   shape.warps_per_slot == 8),
              "nvfp4_gemv: no kernel for ", shape.tiles_per_warp, " tiles and ", shape.warps_per_slot,
              " warps a slot", a.swiglu ? " with SwiGLU" : "");
  const int64_t slots = slots_per_weight(a, shape.tiles_per_warp);
  const int64_t per_cta = kWarps / shape.warps_per_slot;
  // By-id products: a row of CTAs per entry (y) and per product (z).
  int max_entries = 1;
  for (int i = 0; i < a.num_indexed; ++i) max_entries = std::max(max_entries, static_cast<int>(a.indexed[i].entries));
  const dim3 grid(static_cast<unsigned>((slots + per_cta - 1) / per_cta), static_cast<unsigned>(max_entries),
                  static_cast<unsigned>(std::max(1, static_cast<int>(a.num_indexed))));
  DependentLaunch launch(grid, dim3(kThreads), 0, stream, small_op_overlap());
  cudaError_t err = cudaSuccess;
  dispatch_nvfp4_gemv(token_blocks(a), shape.tiles_per_warp, shape.warps_per_slot, a.swiglu, a.num_indexed > 0,
                      [&]<int MB, int TW, int W, bool SW, bool IX>() {
                        err = cudaLaunchKernelEx(&launch.config, nvfp4_gemv_kernel<MB, TW, W, SW, IX>, a);
                      });
  LOCUS_CUDA_CHECK_NAMED(err, "nvfp4_gemv_kernel launch failed");
}

}  // namespace locus::cuda::detail

namespace locus::cuda {

void set_nvfp4_gemv_enabled(bool on) { detail::g_enabled.set(on); }

}  // namespace locus::cuda
