// The NVFP4 decode-batch GEMM on wgmma (nvfp4_wgmma.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/nvfp4_wgmma.h"
#include "backends/cuda/stream_epilogue.cuh"
#include "backends/cuda/stream_gemm_rules.h"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/unit_queue.cuh"
#include "backends/cuda/wgmma.cuh"

namespace locus::cuda::detail {
namespace {

constexpr int kBlockGroups = 4;  // row groups of 64 rows per block (per stage)
constexpr int kStages = 8;       // ring depth: kStages - 2 chunks in flight (one CTA per SM)
constexpr int kChunkK = kNvfp4ChunkK;
constexpr int kWeightBytes = kBlockGroups * kNvfp4GroupTiles * kNvfp4TileBytes;  // 8 KB per chunk
constexpr int kScaleBytes = kBlockGroups * kNvfp4GroupTiles * 64;                // 1 KB per chunk
constexpr int kXRowBytes = kChunkK * 2;                                          // one token's chunk
constexpr int kDomainCounters = kStreamGemmMaxDomains;

// A CTA: one warpgroup per L row groups ("slots") of the block, so 4 warpgroups (512 threads) at
// L = 1 and 2 at L = 2; with SwiGLU (H = 2) L = 2: a warpgroup holds one group's gate and up rows.
// Warp (wg, t) dequantizes tile t of its warpgroup's slots.
template <int L>
struct Shape {
  static constexpr int kWarpgroups = kBlockGroups / L;
  static constexpr int kThreads = 128 * kWarpgroups;
};

// A stage: the activations (NT rows of 128 bytes, 128-byte swizzle, 1024-byte aligned for the
// wgmma descriptor), then the weights of the block's 16 tiles (512 bytes each, slot-major), then
// their scale codes (64 bytes per tile).
template <int NT>
constexpr int stage_bytes() {
  static_assert(NT % 8 == 0 && (NT * kXRowBytes + kWeightBytes + kScaleBytes) % 1024 == 0, "stages stay 1024-aligned");
  return NT * kXRowBytes + kWeightBytes + kScaleBytes;
}

struct WgPlan {
  int32_t chunks;                        // C per block
  int32_t blocks[kStreamGemmMaxDomains];  // per domain (its parts' blocks end to end)
  int32_t units[kStreamGemmMaxDomains];
  int32_t max_segments;                  // partial slots per block
  unsigned* counters;                    // [domain unit counters][block counters], 0 between launches
  float4* partials;                      // [block][segment][float4 i][thread]
  int32_t total_ctas, static_first, counted;
};

// Row blocks of a part: 4 row groups, or with SwiGLU 2 groups' gate and up rows.
template <int H>
__host__ __device__ __forceinline__ int part_blocks(const StreamGemmPart& p) {
  return (p.groups * H + kBlockGroups - 1) / kBlockGroups;
}

// Slot i of block bp of a part: its row group and half (0, or 1 for SwiGLU's up rows).
// Warpgroup wg owns slots wg * L .. wg * L + L - 1.
template <int H>
__device__ __forceinline__ void slot_group(int bp, int slot, int* group, int* half) {
  *group = bp * (kBlockGroups / H) + slot / H;
  *half = slot % H;
}

// The part and part-local block of block r of `domain`.
template <int H>
__device__ __forceinline__ int decode_block(const StreamGemmArgs& a, int domain, int64_t r, int* bp) {
  int q = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    const StreamGemmPart& c = a.parts[i];
    if (c.domain == domain && r >= c.row_begin && r < c.row_begin + part_blocks<H>(c)) {
      q = i;
      break;
    }
  }
  *bp = static_cast<int>(r - a.parts[q].row_begin);
  return q;
}

// A thread's copy sources for one block: for each of its warpgroup's slots, its warp's tile at
// chunk 0 (the lane's 16 bytes) and the tile's scale codes (lanes 0..3, 16 bytes each); chunk c is
// c * 4 tiles further (group-major layout).
template <int L>
struct BlockSource {
  const uint8_t* w[L];
  const uint8_t* s[L];
  bool valid[L];
};

template <int H, int L>
__device__ __forceinline__ BlockSource<L> block_source(const StreamGemmArgs& a, int domain, int64_t r, int chunks,
                                                       int wg, int tile_in_group, int lane) {
  BlockSource<L> src;
  int bp;
  const StreamGemmPart& p = a.parts[decode_block<H>(a, domain, r, &bp)];
#pragma unroll
  for (int j = 0; j < L; ++j) {
    int group, half;
    slot_group<H>(bp, wg * L + j, &group, &half);
    src.valid[j] = group < p.groups;
    // Tiles past the part's rows read its last tile (valid memory); their outputs are dropped.
    const int tile = min(group * kNvfp4GroupTiles + tile_in_group, p.tiles - 1) + half * static_cast<int>(p.up_offset);
    const int64_t at = nvfp4_tile_index(tile, 0, chunks);
    src.w[j] = static_cast<const uint8_t*>(p.w) + (at * 32 + lane) * 16;
    src.s[j] = reinterpret_cast<const uint8_t*>(p.scales) + at * 64 + (lane & 3) * 16;
  }
  return src;
}

// Lane P of a warp copies the token's physical K pair P of the chunk (4 bytes) to where the wgmma
// B tile wants it: logical pair nvfp4_logical_pair(P) of the row (nvfp4_layout.h), in the 128-byte
// swizzle. The offset within an 8-row atom, for the row with m % 8 = `row8`.
[[maybe_unused]] __device__ __forceinline__ uint32_t x_pair_offset(int row8, int pair) {
  const int logical = nvfp4_logical_pair(pair);
  return row8 * kXRowBytes + (((logical >> 2) ^ row8) << 4) + (logical & 3) * 4;
}

// The outputs (or partial) of block r's segment [c0, c1) of unit `unit`, from the accumulators
// d of the warpgroup's slots (gate and up with H = 2).
template <int NT, int H, int L>
__device__ __forceinline__ void finish_segment(const StreamGemmArgs& a, const WgPlan& pl, int domain, int unit,
                                               int64_t r, int c0, int c1, float (&d)[L][NT / 8][4], int wg,
                                               int tile_in_group, int lane, unsigned* s_last) {
  constexpr int kNB = NT / 8, kPartF4 = L * kNB, kThreads = Shape<L>::kThreads;
  int bp;
  const StreamGemmPart& p = a.parts[decode_block<H>(a, domain, r, &bp)];
  const float scale = *p.global_scale * kNvfp4AccUnscale;
  auto store = [&](const float (&v)[L][kNB][4]) {
    if constexpr (H == 2) {  // the slots are one group's gate and up rows
      static_assert(L == 2, "SwiGLU keeps gate and up in one warpgroup");
      int group, half;
      slot_group<H>(bp, wg * L, &group, &half);
      if (group < p.groups) store_fragments<kNB, 2>(a, p, 0, group * kNvfp4GroupTiles + tile_in_group, lane, scale, v);
    } else {
#pragma unroll
      for (int j = 0; j < L; ++j) {
        int group, half;
        slot_group<H>(bp, wg * L + j, &group, &half);
        if (group < p.groups)
          store_fragments<kNB, 1>(a, p, 0, group * kNvfp4GroupTiles + tile_in_group, lane, scale,
                                  reinterpret_cast<const float(&)[1][kNB][4]>(v[j]));
      }
    }
  };
  if (c0 == 0 && c1 == pl.chunks) {  // the whole block: no partials
    store(d);
    return;
  }
  const int64_t c = pl.chunks, t = static_cast<int64_t>(pl.blocks[domain]) * c;
  const int64_t first = stream_k_unit_of(t, pl.units[domain], r * c);
  const int segments = static_cast<int>(stream_k_unit_of(t, pl.units[domain], r * c + c - 1) - first + 1);
  const int64_t block = p.group_base + bp;  // over all domains
  auto slot = [&](int seg) { return pl.partials + (block * pl.max_segments + seg) * kPartF4 * kThreads; };
  float4* mine = slot(static_cast<int>(unit - first));
#pragma unroll
  for (int h = 0; h < L; ++h)
#pragma unroll
    for (int b = 0; b < kNB; ++b)
      __stcg(mine + (h * kNB + b) * kThreads + threadIdx.x, make_float4(d[h][b][0], d[h][b][1], d[h][b][2], d[h][b][3]));
  __threadfence();  // the partial is visible before it is counted
  __syncthreads();
  unsigned* counter = pl.counters + kDomainCounters + block;
  if (threadIdx.x == 0) *s_last = atomicAdd(counter, 1u) == static_cast<unsigned>(segments - 1);
  __syncthreads();
  if (!*s_last) return;
  __threadfence();
  float sum[L][kNB][4] = {};
  for (int seg = 0; seg < segments; ++seg) {  // in segment order, whoever is last
    const float4* in = slot(seg);
#pragma unroll
    for (int h = 0; h < L; ++h)
#pragma unroll
      for (int b = 0; b < kNB; ++b) {
        const float4 v = __ldcg(in + (h * kNB + b) * kThreads + threadIdx.x);
        sum[h][b][0] += v.x;
        sum[h][b][1] += v.y;
        sum[h][b][2] += v.z;
        sum[h][b][3] += v.w;
      }
  }
  store(sum);
  if (threadIdx.x == 0) *counter = 0;  // every segment has arrived: ready for the next launch
}

// Streams chunks [begin, end) of `domain`'s blocks through the CTA's ring (stage j % kStages) and
// finishes each block segment. All threads take part; one barrier per chunk makes its copies
// visible to every warpgroup and frees the stage of chunk j - 2 (the wgmma of chunk j - 1 may
// still run) for refilling.
template <int NT, int H, int L>
__device__ __forceinline__ void stream_unit(const StreamGemmArgs& a, const WgPlan& pl, int domain, int unit,
                                            int64_t begin, int64_t end, uint32_t ring, unsigned* s_last) {
  using S = Shape<L>;
  constexpr int kNB = NT / 8;
  constexpr int kStageBytes = stage_bytes<NT>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2, tile_in_group = warp & 3;
  const int64_t c = pl.chunks;
  const int n = static_cast<int>(end - begin);

  // Activations: warp w copies tokens w, w + kWarps, ... (those < M; all of them have
  // m % 8 = w % 8); lane = the K pair.
  constexpr int kWarps = S::kThreads / 32;
  const int x_rows = (min(a.m, NT) - warp + kWarps - 1) / kWarps;
  const uint32_t x_dst = (warp - (warp & 7)) * kXRowBytes + x_pair_offset(warp & 7, lane);
  const int x_first = warp * static_cast<int>(a.x_ld) + 2 * lane;  // elements (x is at most 64 rows)
  const int x_step = kWarps * static_cast<int>(a.x_ld);

  // Issue side: unit chunk j into stage j % kStages (one commit group per call).
  int64_t issue_block = begin / c;
  int issue_chunk = static_cast<int>(begin - issue_block * c);
  BlockSource<L> src = block_source<H, L>(a, domain, issue_block, pl.chunks, wg, tile_in_group, lane);
  auto issue = [&](int j) {
    if (j < n) {
      if (issue_chunk == c) {
        ++issue_block;
        issue_chunk = 0;
        src = block_source<H, L>(a, domain, issue_block, pl.chunks, wg, tile_in_group, lane);
      }
      const uint32_t stage = ring + (j % kStages) * kStageBytes;
      const int k0 = issue_chunk * kChunkK;
      const bool k_valid = k0 + 2 * lane < a.k;
      const uint16_t* from = a.x + x_first + (k_valid ? k0 : 0);
      for (int i = 0; i < x_rows; ++i)
        cp_async4(stage + x_dst + i * (kWarps * kXRowBytes), from + i * x_step, k_valid);
      const uint32_t w_stage = stage + NT * kXRowBytes, s_stage = w_stage + kWeightBytes;
      const int64_t step = static_cast<int64_t>(issue_chunk) * kNvfp4GroupTiles;
#pragma unroll
      for (int h = 0; h < L; ++h) {
        if (!src.valid[h]) continue;
        const int tile_slot = (wg * L + h) * kNvfp4GroupTiles + tile_in_group;
        cp_async16(w_stage + tile_slot * kNvfp4TileBytes + lane * 16, src.w[h] + step * kNvfp4TileBytes);
        if (lane < 4) cp_async16(s_stage + tile_slot * 64 + lane * 16, src.s[h] + step * 64);
      }
      ++issue_chunk;
    }
    cp_async_commit();
  };
  for (int j = 0; j < kStages - 2; ++j) issue(j);

  // Compute side. The accumulators are written by wgmma only (a segment's first step starts them
  // afresh); zeroing them in the loop would make ptxas wait for every group at the loop's end.
  float d[L][kNB][4] = {};
  int64_t block = begin / c;  // the compute cursor (the issue cursor is kStages - 2 chunks ahead)
  int chunk = static_cast<int>(begin - block * c), seg_c0 = chunk;
  // Unit chunk j from its stage into d; finishes the segment at its end. The previous chunk's
  // group is waited for before the A registers are rewritten (a running wgmma reads its register
  // operands); the other warpgroups' work overlaps that wait.
  auto step = [&](int j) {
    const uint32_t stage = ring + (j % kStages) * kStageBytes;
    const uint32_t w_stage = stage + NT * kXRowBytes, s_stage = w_stage + kWeightBytes;
    wgmma_wait<0>();
    // Slots past the part's last group were not copied: their stale stage bytes give rows whose
    // outputs finish_segment drops. Computing them anyway keeps wgmma out of a branch (ptxas
    // serializes wgmma in divergent code).
    uint32_t lo[L][8], hi[L][8];
#pragma unroll
    for (int h = 0; h < L; ++h) {
      const int tile_slot = (wg * L + h) * kNvfp4GroupTiles + tile_in_group;
      nvfp4_dequant_tile(lds128(w_stage + tile_slot * kNvfp4TileBytes + lane * 16),
                         lds16(s_stage + tile_slot * 64 + lane * 2), lo[h], hi[h]);
    }
    wgmma_fence();
#pragma unroll
    for (int h = 0; h < L; ++h)
#pragma unroll
      for (int s = 0; s < 4; ++s)
        wgmma_bf16_rs<kNB>(reinterpret_cast<float(&)[kNB * 4]>(d[h]), lo[h][2 * s], hi[h][2 * s], lo[h][2 * s + 1],
                           hi[h][2 * s + 1], wgmma_desc_k128(stage + 32 * s), s > 0 || chunk != seg_c0);
    wgmma_commit();
    if (++chunk == c || j == n - 1) {  // the end of this block's segment
      wgmma_wait<0>();
#pragma unroll
      for (int h = 0; h < L; ++h) wgmma_keep(reinterpret_cast<float(&)[kNB * 4]>(d[h]));
      finish_segment<NT, H, L>(a, pl, domain, unit, block, seg_c0, chunk, d, wg, tile_in_group, lane, s_last);
      ++block;
      chunk = seg_c0 = 0;
    }
  };
  for (int j = 0; j < n; ++j) {
    cp_async_wait<kStages - 3>();  // this thread's copies of chunk j have landed
    fence_proxy_async_shared();
    __syncthreads();  // everyone's have; and every warpgroup is done reading chunk j - 2's stage
    issue(j + kStages - 2);  // into chunk j - 2's stage
    step(j);
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
}

template <int NT, int H, int L>
__global__ void __launch_bounds__(Shape<L>::kThreads, 1)
    nvfp4_wgmma_kernel(const __grid_constant__ StreamGemmArgs a, const __grid_constant__ WgPlan pl) {
#if LOCUS_WGMMA
  extern __shared__ uint8_t smem[];
  __shared__ int s_domain, s_unit;
  __shared__ unsigned s_last;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t ring = (base + 1023u) & ~1023u;  // the swizzle needs 1024-byte aligned stages
  launch_dependents();
  wait_for_previous_grid();  // before the counters, activations, partials or outputs are touched
  UnitQueue<WgPlan> q{pl, a.num_domains, home_domain(a.sm_domain, a.num_domains, kNoDomain)};
  if (threadIdx.x == 0) q.first(&s_domain, &s_unit);
  while (true) {
    __syncthreads();
    const int domain = s_domain, unit = s_unit;
    if (domain < 0) break;
    int64_t begin, end;
    stream_k_range(static_cast<int64_t>(pl.blocks[domain]) * pl.chunks, pl.units[domain], unit, &begin, &end);
    stream_unit<NT, H, L>(a, pl, domain, unit, begin, end, ring, &s_last);
    __syncthreads();
    if (threadIdx.x == 0) q.take(&s_domain, &s_unit);
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// host side

constexpr int kMinUnitChunks = 4;  // shorter units would spend more on their partials than on weights

std::atomic<int> g_min_m{-1};

// (Its limit raised on the current device, which every launch needs; the count, the same on every
// device of a run, asked once.)
template <int NT, int H, int L>
int resident_ctas_per_sm(int smem_bytes) {
  auto* kernel = nvfp4_wgmma_kernel<NT, H, L>;
  raise_dynamic_smem_limit(reinterpret_cast<const void*>(kernel), smem_bytes);
  static std::once_flag once;
  static int per_sm = 0;
  std::call_once(once, [&] {
    LOCUS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Shape<L>::kThreads, smem_bytes));
  });
  return per_sm;
}

template <int NT, int H, int L>
void launch_typed(StreamGemmArgs& a, cudaStream_t stream) {
  const int smem_bytes = kStages * stage_bytes<NT>() + 1024;  // + alignment slack
  WgPlan pl{};
  pl.chunks = static_cast<int32_t>((a.k + kChunkK - 1) / kChunkK);
  int64_t blocks_total = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    StreamGemmPart& p = a.parts[i];
    p.tiles = (p.rows + kNvfp4TileRows - 1) / kNvfp4TileRows;
    p.groups = (p.tiles + kNvfp4GroupTiles - 1) / kNvfp4GroupTiles;
    p.row_begin = pl.blocks[p.domain];
    p.group_base = static_cast<int32_t>(blocks_total);
    pl.blocks[p.domain] += part_blocks<H>(p);
    blocks_total += part_blocks<H>(p);
  }
  const int per_sm = resident_ctas_per_sm<NT, H, L>(smem_bytes);
  LOCUS_CHECK(per_sm >= 1, "NVFP4 wgmma GEMM: ", smem_bytes, " bytes of shared memory per CTA do not fit an SM");
  const int max_ctas = per_sm * sm_count_for(stream);
  const int64_t chunks_total = blocks_total * pl.chunks;
  int64_t units_total = 0;
  pl.max_segments = 1;
  for (int d = 0; d < a.num_domains; ++d) {
    const int64_t t = static_cast<int64_t>(pl.blocks[d]) * pl.chunks;
    if (t == 0) continue;
    const int64_t want = std::max<int64_t>(1, (static_cast<int64_t>(max_ctas) * t + chunks_total / 2) / chunks_total);
    const int64_t units = std::clamp<int64_t>(std::min(want, t / kMinUnitChunks), 1, t);
    pl.units[d] = static_cast<int32_t>(units);
    units_total += units;
    // Units are at least floor(T / U) chunks long, so a block of C chunks meets at most
    // ceil((C - 1) / that) + 1 of them.
    pl.max_segments = std::max<int32_t>(pl.max_segments, static_cast<int32_t>((pl.chunks - 1) / (t / units) + 2));
  }
  const int ctas = static_cast<int>(std::min<int64_t>(max_ctas, units_total));
  pl.total_ctas = ctas;
  pl.static_first = a.num_domains == 1 ? 1 : 0;
  pl.counted = a.num_domains > 1 || units_total > ctas ? 1 : 0;
  const StreamScratch s = stream_scratch(stream, kDomainCounters + static_cast<size_t>(blocks_total),
                                         static_cast<size_t>(blocks_total) * pl.max_segments * L * (NT / 8) * Shape<L>::kThreads);
  pl.counters = s.counters;
  pl.partials = s.partials;
  DependentLaunch launch(dim3(ctas), dim3(Shape<L>::kThreads), smem_bytes, stream, overlaps_previous(ctas, max_ctas));
  LOCUS_CUDA_CHECK_NAMED(cudaLaunchKernelEx(&launch.config, nvfp4_wgmma_kernel<NT, H, L>, a, pl),
                         "NVFP4 wgmma kernel launch");
}

// 64 tokens take two row groups per warpgroup: one would need more than the 128 registers a
// thread of a 512-thread CTA may have (ptxas spills).
void launch_for_m(StreamGemmArgs& a, cudaStream_t stream) {
  if (a.swiglu) {
    a.m <= 32 ? launch_typed<32, 2, 2>(a, stream) : launch_typed<64, 2, 2>(a, stream);
  } else {
    a.m <= 32 ? launch_typed<32, 1, 1>(a, stream) : launch_typed<64, 1, 2>(a, stream);
  }
}

}  // namespace

int nvfp4_wgmma_forced_min_m() {
  int forced = g_min_m.load();
  if (forced < 0) {
    const char* v = std::getenv("LOCUS_NVFP4_WGMMA_MIN_M");
    forced = v && *v ? std::max(1, std::atoi(v)) : 0;
    g_min_m.store(forced);
  }
  return forced;
}

bool nvfp4_use_wgmma(int64_t m, int64_t k) {
  const int forced = nvfp4_wgmma_forced_min_m();
  if (forced > 0) return m >= forced;
  return m >= kNvfp4WgmmaMinM || (m >= kNvfp4WgmmaMinMShortK && k <= kNvfp4WgmmaShortK);
}

void set_nvfp4_wgmma_min_m(int m) { g_min_m.store(std::max(0, m)); }

bool nvfp4_wgmma_eligible(const StreamGemmArgs& a) {
  if (a.format != StreamWeight::kNVFP4 || a.m < 1 || a.m > kNvfp4WgmmaMaxM || a.k < 1 || a.k % 16 != 0) return false;
  // x offsets are 32-bit in the kernel (at most 64 rows).
  if (!aligned16(a.x) || a.x_ld % 8 != 0 || a.x_ld >= (int64_t{1} << 24) || a.y_ld < 0) return false;
  for (int i = 0; i < a.num_parts; ++i)
    if (a.parts[i].batch != 1 || a.parts[i].x != nullptr) return false;
  return true;
}

void launch_nvfp4_wgmma(StreamGemmArgs& a, cudaStream_t stream) {
  LOCUS_CHECK(nvfp4_wgmma_eligible(a), "NVFP4 wgmma GEMM: ineligible problem (M = ", a.m, ", K = ", a.k,
              "; needs 1 <= M <= ", kNvfp4WgmmaMaxM, ", K % 16 == 0 and 16-byte aligned activation rows)");
  check_stream_gemm_parts(a, "NVFP4 wgmma GEMM");
  launch_for_m(a, stream);
}

}  // namespace locus::cuda::detail
