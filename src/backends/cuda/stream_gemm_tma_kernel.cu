// The NVFP4 streaming GEMM fed by a TMA producer warp (StreamGemmTuning::feed = 1; stream_gemm.h).
//
// Why. The cp.async kernel fills an SM with two 8-warp CTAs (their registers), so the next
// launch's CTAs start only as these leave, and every launch pays its ring fill, its partial sums
// and its slowest CTA with nothing overlapping them: about 11 of the 33 us of 18432 x 7168 at
// M = 1 (the timeline in docs/benchmarks.md, tenth session). Here a CTA is 8 consumer warps and
// one producer warp in at most half an SM (at most 96 registers per thread, the launch bounds'
// cap, and, where it fits, half the shared memory), one CTA per SM per launch. So the next
// launch's CTAs are resident while this one streams, and their producers copy their first chunks
// of weights before this launch ends (no kernel writes weights: cuda_hooks.cpp, rule 5); the
// activations follow after it. Copies no longer need the consumers' issue slots, so 8 warps per
// SM dequantize while ~75-100 KB per SM are in flight (StreamGemmTuning::warps = 16 gives a CTA
// 16 consumer warps, one CTA per SM and no next launch beside, to compare).
//
// Measured on the H200 (2026-12-05, docs/benchmarks.md): the launches overlap as meant, but the
// feed streams at about 2.85 TB/s against the cp.async rings' 3.6 (18432 x 7168, M = 1: 37.6
// against 32.4 us per call): half an SM holds fewer bytes in flight than the rings keep. So it is
// opt-in (StreamGemmTuning::feed), not the default.
//
// How. The work is the cp.async kernel's: per domain, stream-K units of its rows laid end to end;
// with one domain CTA b's first unit is unit b, further units (and every unit with several
// domains: own domain first, then the others') come from counters (unit_queue.cuh). Lane 0 of the
// producer warp takes them and hands them to the consumers through shared memory. Consumer warp
// w multiplies a contiguous 1/8 of each unit's chunks and leaves its row sums in the row slots;
// the unit ends in the same finish_unit, on a barrier of the consumer warps alone. Each consumer
// warp has a ring of D stages (2..6), a stage up to S chunks of one row (stream_tma_cursor.h; S = 2
// where two such stages fit, else 1): their codes and scale codes (two bulk copies where the
// group's 4 tiles are one storage group, else one per tile and chunk), then their activations,
// an [M, 64 S] box of x by a tensor copy (zeros past M and K). Three copies per stage of two
// chunks, not per chunk, where they fit: the copies' count limits a TMA feed (2.0 TB/s with one
// chunk per stage on the H200, 2026-12-05). Lane w of the producer warp fills consumer warp w's
// ring, across units; full and empty mbarriers per stage. A stage's full barrier expects its
// weights and activations at once, so (one domain: the first unit is known) the weights of a
// warp's first D stages can go in before the previous kernel has ended and the activations after.
#include <cuda.h>

#include <algorithm>

#include "backends/cuda/cta_trace.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/driver_api.h"
#include "backends/cuda/stream_gemm_device.cuh"
#include "backends/cuda/stream_gemm_launch.h"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/stream_tma_cursor.h"
#include "backends/cuda/tma.cuh"

namespace locus::cuda::detail {
namespace {

// Consumer warps per CTA (the producer is warp W): 8 by default, so that with the producer warp
// two CTAs fit an SM, this launch's and the next one's; 16 with StreamGemmTuning::warps = 16, one
// CTA per SM with twice the warps dequantizing and no next launch beside (an experiment: which
// limits the call, the warps that dequantize or the gaps between launches?).
constexpr int kTmaWarpsBeside = kWideWarps, kTmaWarpsAlone = 2 * kWideWarps;
template <int W>
constexpr int kThreadsOf = 32 * (W + 1);
constexpr int kMaxStages = kStreamTmaMaxStages;
constexpr int kSmemAlign = 128;                    // tensor copies land on 128-byte boundaries
using Nv = Format<StreamWeight::kNVFP4>;
static_assert(kTmaChunkWeightBytes % kSmemAlign == 0 && kTmaChunkXRowBytes % kSmemAlign == 0,
              "every stage and its activations start on a 128-byte boundary");

constexpr int kUnitSlots = 2;  // units handed from the producer to the consumers, one ahead

template <int W>
struct TmaSmem {
  uint64_t full[W][kMaxStages];   // a stage's chunk landed
  uint64_t empty[W][kMaxStages];  // its warp has read it
  uint64_t unit_full[kUnitSlots];          // the producer wrote the slot's unit
  uint64_t unit_empty[kUnitSlots];         // the consumers are done with it
  int2 units[kUnitSlots];                  // (domain, unit); domain -1: no more
  unsigned last[kMaxUnitRows];             // finish_unit's flags
  unsigned long long* trace;               // this CTA's timeline record, or nullptr
};

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Warp w's chunks [*wb, *we) of `domain`'s unit `unit` (of the domain's rows laid end to end).
template <int W>
__device__ __forceinline__ void warp_range(const Plan& pl, int domain, int64_t unit, int w, int64_t* wb, int64_t* we) {
  int64_t begin, end;
  unit_range(pl, domain, unit, &begin, &end);
  *wb = begin + (end - begin) * w / W;
  *we = begin + (end - begin) * (w + 1) / W;
}

// A consumer warp's ring stage for its k-th stage of chunks over the launch, and its barriers.
template <int W>
struct Rings {
  const Plan& pl;
  TmaSmem<W>& s;
  uint32_t base;  // warp 0's stage 0
  __device__ int index(uint32_t k) const { return static_cast<int>(k % static_cast<uint32_t>(pl.stages)); }
  __device__ uint32_t stage(int w, uint32_t k) const { return base + (w * pl.stages + index(k)) * pl.slot_bytes; }
  __device__ uint32_t full(int w, uint32_t k) const { return shared_address(&s.full[w][index(k)]); }
  __device__ uint32_t empty(int w, uint32_t k) const { return shared_address(&s.empty[w][index(k)]); }
  // The parity of the barrier phase that the k-th use of its stage completes.
  __device__ uint32_t parity(uint32_t k) const { return (k / static_cast<uint32_t>(pl.stages)) & 1u; }
};

// Producer lane w of the producer warp fills consumer warp w's ring: its chunks in order, each
// once its stage is free. (A lane per consumer warp, so that the per-chunk bookkeeping of the 8
// rings runs side by side; the lanes wait for their stages in step, much as one thread serving
// the rings round robin would.)
template <int H, int W>
struct ProducerLane {
  const StreamGemmArgs& a;
  const Plan& pl;
  const CUtensorMap* xmap;
  Rings<W> rings;
  int w;
  uint32_t k = 0;  // stages put into the ring so far
  TmaChunkCursor<H, Plan> cur{a, pl};  // the next chunk to put in

  // The weights of the n chunks from the cursor's into stage `dst`, completing on `bar`.
  __device__ void copy_weights(uint32_t dst, uint32_t bar, int n) const {
    cur.weight_copies(n, [&](int offset, const uint8_t* src, int bytes) { bulk_copy_to(dst + offset, src, bytes, bar); });
  }
  // The activations of the stage from the cursor's chunk, x[0..M, 64 c..64 (c + S)), after the
  // stage's weights (the whole box lands, zeros past K, however many chunks the stage has).
  __device__ void copy_x(uint32_t dst, uint32_t bar) const {
    tensor_copy_2d(dst + TmaStageLayout{pl.stage_chunks}.x(0), xmap, cur.c * Nv::kChunkK, 0, bar);
  }
  // Whether the ring's next stage is free (its previous chunk read), without waiting.
  __device__ bool stage_free() const {
    return k < static_cast<uint32_t>(pl.stages) || mbar_done(rings.empty(w, k), rings.parity(k) ^ 1u);
  }
  // Puts the stage from the cursor's chunk (of a share ending before chunk `we`) into the ring's
  // next stage (free): expects the whole stage (weights and activations), copies the weights and,
  // with `with_x`, the activations; moves on.
  __device__ void issue(bool with_x, int64_t we) {
    const uint32_t dst = rings.stage(w, k), bar = rings.full(w, k);
    const int n = cur.stage_chunks(we);
    mbar_expect(bar, TmaStageLayout{pl.stage_chunks}.landed_bytes(n, a.m));
    copy_weights(dst, bar, n);
    if (with_x) copy_x(dst, bar);
    ++k;
    cur.advance(n);
  }

  // Asks L2 for the lane's share of pl.prefetch_bytes (StreamGemmTuning::prefetch_kb) of the
  // chunks after the cursor, within its row and below `we` (the row's stretch of codes and
  // scales; nothing where the row is copied tile by tile).
  __device__ void prefetch_more(int64_t we) const {
    constexpr int R = kNvfp4GroupTiles;
    if (pl.prefetch_bytes <= 0 || cur.codes == nullptr || cur.x >= we) return;
    const int64_t wanted = pl.prefetch_bytes / W / Nv::kWeightBytes;
    const int64_t n = min(min(wanted, we - cur.x), static_cast<int64_t>(pl.chunks - cur.c));
    if (n <= 0) return;
    prefetch_l2_bulk(cur.codes, static_cast<uint32_t>(n * R * kNvfp4TileBytes));
    prefetch_l2_bulk(cur.scales, static_cast<uint32_t>(n * R * cur.kScaleBytes));
  }

  // Lane 0 hands unit `u` of `d` (d = -1: none left) to the consumers through unit slot
  // `*handed` % kUnitSlots, once they are done with the unit that slot held before.
  __device__ void hand_over(int d, int u, uint32_t* handed) const {
    if (w != 0) return;
    const int j = static_cast<int>(*handed % kUnitSlots);
    if (*handed >= kUnitSlots) mbar_wait(shared_address(&s().unit_empty[j]), ((*handed / kUnitSlots) - 1) & 1);
    s().units[j] = make_int2(d, u);
    mbar_arrive(shared_address(&s().unit_full[j]));  // release: the consumers see the unit
    ++*handed;
  }
  __device__ TmaSmem<W>& s() const { return rings.s; }

  // Every chunk of warp w's share of the CTA's units, which lane 0 takes (own domain first, then
  // the others': unit_queue.cuh) and hands to the consumers. With one domain a CTA's first unit
  // is its block index, known before the previous kernel has ended: the weights of its first D
  // stages go in before that (the stages are free), their activations after it. With several,
  // units come from counters the previous kernel leaves, so the first is taken after the wait.
  // Between units the lanes meet (__syncwarp) for lane 0's answer; otherwise a lane polls its next
  // stage and never blocks, so that no lane's wait holds up another's copies however the warp's
  // lanes converge (a lane whose consumer warp waits at a unit's end for the other consumers must
  // not be stuck behind a lane that waits for its own consumer).
  __device__ void run(int home) {
    constexpr unsigned kLanes = (1u << W) - 1;
    UnitQueue<Plan> q{pl, a.num_domains, home};
    uint32_t handed = 0;
    int u = 0;
    int64_t wb = 0, we = 0;
    uint32_t early = 0;  // stages put in before the wait
    cur.domain = -1;
    if (pl.static_first) {  // one domain: unit blockIdx.x
      cur.domain = 0;
      u = static_cast<int>(blockIdx.x);
      warp_range<W>(pl, cur.domain, u, w, &wb, &we);
      cur.seek(wb);
      for (; early < static_cast<uint32_t>(pl.stages) && cur.x < we; ++early) issue(false, we);
      prefetch_more(we);
    }
    wait_for_previous_grid();  // the activations may be its outputs; the counters its leftovers
    if (pl.static_first) {
      cur.seek(wb);
      for (uint32_t i = 0; i < early; ++i) {
        const int n = cur.stage_chunks(we);
        copy_x(rings.stage(w, i), rings.full(w, i));
        cur.advance(n);
      }
    } else {
      if (w == 0) q.take(&cur.domain, &u);
      cur.domain = __shfl_sync(kLanes, cur.domain, 0);
      u = __shfl_sync(kLanes, u, 0);
      if (cur.domain >= 0) {
        warp_range<W>(pl, cur.domain, u, w, &wb, &we);
        cur.seek(wb);
      }
    }
    hand_over(cur.domain, u, &handed);
    while (cur.domain >= 0) {
      if (cur.x == we) {  // the unit's chunks are in: the CTA's next unit
        __syncwarp(kLanes);
        if (w == 0) q.take(&cur.domain, &u);
        cur.domain = __shfl_sync(kLanes, cur.domain, 0);
        u = __shfl_sync(kLanes, u, 0);
        hand_over(cur.domain, u, &handed);
        if (cur.domain < 0) break;
        warp_range<W>(pl, cur.domain, u, w, &wb, &we);
        cur.seek(wb);
      } else if (stage_free()) {
        issue(true, we);
      } else {
        __nanosleep(32);  // leave the issue slots to the consumer warps while the stage drains
      }
    }
  }
};

// Consumer warp `warp`: multiplies its chunks [wb, we) as they land (its k-th stage over the
// launch in ring stage k; *consumed counts them; a stage holds the chunks stage_chunks says, up
// to S of one row) and leaves each row's sums in its row slot, as the cp.async kernel's
// warp_stream does. Traced launches stamp kStreamTraceFirst into `trace`
// (if not nullptr) when its first chunk has landed.
template <int MB, bool kTraced, int W>
__device__ __forceinline__ void consume(const StreamGemmArgs& a, const Plan& pl, const Rings<W>& rings, int64_t wb,
                                        int64_t we, int64_t r_first, uint8_t* slots, int warp, int lane,
                                        uint32_t* consumed, unsigned long long* trace) {
  const TmaStageLayout at{pl.stage_chunks};
  RowSums<kNvfp4GroupTiles, MB> sums;
  sums.start(wb, pl.chunks);
  for (int64_t x = wb; x < we;) {
    // The producer's count (sums.left: the chunks left in the row of the next chunk; 0 where that
    // row is done and the next begins).
    const int n = at.chunks(we - x, sums.left == 0 ? sums.chunks : sums.left);
    const uint32_t k = (*consumed)++;
    mbar_wait(rings.full(warp, k), rings.parity(k));
    if constexpr (kTraced) {
      if (k == 0 && lane == 0) stamp(trace, kStreamTraceFirst);
    }
    const uint32_t stage = rings.stage(warp, k);
#pragma unroll
    for (int j = 0; j < kTmaMaxStageChunks; ++j) {
      if (j < n) {
        sums.next_chunk(slots, warp, r_first, lane);
        Nv::template mma_at<MB>(stage + at.codes(j), stage + at.scales(j), stage + at.x(j), at.x_row_bytes(), lane, a.m,
                                sums.acc);
      }
    }
    __syncwarp();  // every lane has read the stage
    if (lane == 0) mbar_arrive(rings.empty(warp, k));
    x += n;
  }
  sums.leave(slots, warp, r_first, lane);
}

template <int MB, int H, bool kTraced, int W>
__global__ void __launch_bounds__(kThreadsOf<W>, W == kTmaWarpsBeside ? 2 : 1)
    stream_gemm_tma_kernel(const __grid_constant__ StreamGemmArgs a, const __grid_constant__ Plan pl,
                           const __grid_constant__ CUtensorMap xmap) {
  extern __shared__ uint8_t smem[];
  __shared__ TmaSmem<W> s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t raw = shared_address(smem);
  const uint32_t base = (raw + kSmemAlign - 1) / kSmemAlign * kSmemAlign;
  uint8_t* slots = smem + (base - raw) + W * pl.ring_bytes;  // the row slots after the rings
  const Rings<W> rings{pl, s, base};
  if (threadIdx.x == 0) {
    for (int w = 0; w < W; ++w)
      for (int i = 0; i < pl.stages; ++i) {
        mbar_init(shared_address(&s.full[w][i]), 1);
        mbar_init(shared_address(&s.empty[w][i]), 1);
      }
    for (int j = 0; j < kUnitSlots; ++j) {
      mbar_init(shared_address(&s.unit_full[j]), 1);
      mbar_init(shared_address(&s.unit_empty[j]), 1);
    }
    mbar_init_fence();
    s.trace = kTraced ? open_trace_record(pl.trace, kStreamTraceWords) : nullptr;
  }
  __syncthreads();  // the last barrier of the whole CTA: from here on the roles part
  launch_dependents();
  if (warp == W) {  // the producer warp: lane w feeds consumer warp w
    if (lane == 0) prefetch_tensor_map(&xmap);
    if (lane < W) ProducerLane<H, W>{a, pl, &xmap, rings, lane}.run(home_domain(a.sm_domain, a.num_domains, kNoDomain));
    return;
  }
  // Thread 0 stamps word w of the CTA's timeline record (traced launches only).
  auto mark = [&](int w) {
    if constexpr (kTraced) {
      if (threadIdx.x == 0) stamp(s.trace, w);
    }
  };
  wait_for_previous_grid();  // before the counters, partials or outputs are touched
  mark(kStreamTraceWaited);
  uint32_t consumed = 0;
  for (uint32_t taken = 0;; ++taken) {  // the units the producer hands over, in order
    const int j = static_cast<int>(taken % kUnitSlots);
    mbar_wait(shared_address(&s.unit_full[j]), (taken / kUnitSlots) & 1);
    const int domain = s.units[j].x, unit = s.units[j].y;
    if (domain < 0) break;
    int64_t begin, end, wb, we;
    unit_range(pl, domain, unit, &begin, &end);
    warp_range<W>(pl, domain, unit, warp, &wb, &we);
    if (we > wb)
      consume<MB, kTraced, W>(a, pl, rings, wb, we, begin / pl.chunks, slots, warp, lane, &consumed,
                           kTraced && warp == 0 ? s.trace : nullptr);
    unit_barrier<W, true>();
    mark(kStreamTraceStreamed);
    finish_unit<StreamWeight::kNVFP4, MB, H, W, true>(a, pl, domain, unit, begin, end, slots, warp, lane,
                                                     s.last);  // ends with a barrier: the slot was read
    mark(kStreamTraceEnd);
    if (threadIdx.x == 0) mbar_arrive(shared_address(&s.unit_empty[j]));
  }
}

// ---------------------------------------------------------------------------------------------
// host side

// x [M, K] bf16 (rows x_ld apart) as boxes of [M, 64 S] (no swizzle: a stage's activation rows of
// S x 128 bytes, stream_tma_cursor.h); elements past K read as zeros.
CUtensorMap activation_map(const StreamGemmArgs& a, int stage_chunks) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.k), static_cast<cuuint64_t>(a.m)};
  // One row's stride is never used, but the map wants one of at least a row (16-byte multiple).
  const int64_t ld = a.m == 1 ? std::max<int64_t>(a.x_ld, (a.k + 7) / 8 * 8) : a.x_ld;
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(stage_chunks * Nv::kChunkK), static_cast<cuuint32_t>(a.m)};
  const cuuint32_t one[2] = {1, 1};
  check_cu(driver().cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(a.x), dims,
                                           strides, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                           CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           "cuTensorMapEncodeTiled (streaming GEMM activations)");
  return map;
}

template <int MB, int H, int W>
bool launch_typed(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total, int sms,
                  const StreamGemmTuning& t, cudaStream_t stream) {
  constexpr int R = kNvfp4GroupTiles, kThreads = kThreadsOf<W>;
  const int rows_per_unit = unit_rows_one_per_cta(work, sms, W);  // one unit per SM
  const int slots_bytes = (W + rows_per_unit - 1) * R * MB * 512;
  auto slot_bytes = [&](int chunks) { return TmaStageLayout{chunks}.bytes(a.m); };
  auto smem_for = [&](int chunks, int stages) { return kSmemAlign + W * stages * slot_bytes(chunks) + slots_bytes; };
  auto per_sm = [&](int chunks, int stages) {
    return resident_ctas_per_sm(reinterpret_cast<const void*>(stream_gemm_tma_kernel<MB, H, false, W>),
                                reinterpret_cast<const void*>(stream_gemm_tma_kernel<MB, H, true, W>), kThreads,
                                smem_for(chunks, stages));
  };
  // Two chunks per stage where at least two such stages fit (fewer copies: stream_tma_cursor.h)
  // and K has two chunks (the activation box may not be wider than x), else one. Then the deepest
  // ring with which two CTAs fit an SM (this launch's and the next one's), else one (16 consumer
  // warps: always one); or the ring depth asked for.
  int stage_chunks = 0, stages = 0;
  for (int chunks = a.k >= kTmaMaxStageChunks * Nv::kChunkK ? kTmaMaxStageChunks : 1; chunks >= 1 && stages == 0;
       --chunks) {
    if (t.stages > 0) {
      if (per_sm(chunks, t.stages) >= 1) stages = t.stages;
    } else {
      for (int want : {W == kTmaWarpsBeside ? 2 : 1, 1})
        for (int d = kMaxStages; d >= 2 && stages == 0; --d)
          if (per_sm(chunks, d) >= want) stages = d;
    }
    if (stages > 0) stage_chunks = chunks;
  }
  if (stages == 0) return false;

  Plan pl{};
  const int blocks = plan_units(pl, a, work, sms, sms, W, H, t.units_per_cta, rows_per_unit, groups_total, rows_total,
                                R * MB * 32, stream);  // one CTA per SM
  pl.slot_bytes = slot_bytes(stage_chunks);
  pl.stages = stages;
  pl.stage_chunks = stage_chunks;
  pl.ring_bytes = stages * pl.slot_bytes;
  pl.overlapped = t.dependent_launch ? 1 : 0;
  pl.prefetch_bytes = t.prefetch_kb << 10;  // none by default: the rings' first stages are copied early
  pl.trace = t.trace;
  const CUtensorMap xmap = activation_map(a, stage_chunks);
  DependentLaunch launch(dim3(blocks), dim3(kThreads), smem_for(stage_chunks, stages), stream, pl.overlapped != 0);
  auto* kernel =
      pl.trace.buf != nullptr ? stream_gemm_tma_kernel<MB, H, true, W> : stream_gemm_tma_kernel<MB, H, false, W>;
  LOCUS_CUDA_CHECK_NAMED(cudaLaunchKernelEx(&launch.config, kernel, a, pl, xmap),
                         "streaming GEMM (TMA feed) kernel launch");
  return true;
}

template <int H, int W>
bool launch_for_m(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total, int sms,
                  const StreamGemmTuning& t, cudaStream_t stream) {
  return a.m <= 8 ? launch_typed<1, H, W>(a, work, groups_total, rows_total, sms, t, stream)
                  : launch_typed<2, H, W>(a, work, groups_total, rows_total, sms, t, stream);
}

template <int H>
bool launch_for_warps(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total, int sms,
                      const StreamGemmTuning& t, cudaStream_t stream) {
  return t.warps == kTmaWarpsAlone ? launch_for_m<H, kTmaWarpsAlone>(a, work, groups_total, rows_total, sms, t, stream)
                                   : launch_for_m<H, kTmaWarpsBeside>(a, work, groups_total, rows_total, sms, t, stream);
}

}  // namespace

bool launch_stream_gemm_tma(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total,
                            int sms, const StreamGemmTuning& t, cudaStream_t stream) {
  int device = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&device));
  // K < 64: the activation box (64 wide) would be wider than the tensor, which the tensor-map
  // rules do not promise to accept; such weights are tiny, the cp.async kernel takes them.
  if (a.format != StreamWeight::kNVFP4 || a.m > 16 || a.k < Nv::kChunkK || !device_has_tma(device)) return false;
  for (int i = 0; i < a.num_parts; ++i)
    if ((a.parts[i].x != nullptr && a.parts[i].x != a.x) || a.parts[i].weight_ids != nullptr) return false;
  return a.swiglu ? launch_for_warps<2>(a, work, groups_total, rows_total, sms, t, stream)
                  : launch_for_warps<1>(a, work, groups_total, rows_total, sms, t, stream);
}

}  // namespace locus::cuda::detail
