// The weight-streaming skinny GEMM and its locality-domain form (stream_gemm.h), fed by per-warp
// cp.async rings.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "backends/cuda/cta_trace.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/stream_gemm_device.cuh"
#include "backends/cuda/stream_gemm_launch.h"
#include "backends/cuda/stream_scratch.h"

namespace locus::cuda::detail {
namespace {

// Most pipeline stages per warp: kStreamRingMaxStages (stream_gemm_launch.h); launch_shape takes
// fewer where that keeps two CTAs per SM (bench/cuda/stream_probe.cu on the H200: with 16 warps
// per SM a deeper ring gains nothing).
constexpr int kMaxPipelineStages = kStreamRingMaxStages;
static_assert(Format<StreamWeight::kNVFP4>::kGroupTiles == kStreamGroupTiles &&
                  Format<StreamWeight::kBF16>::kGroupTiles == kStreamGroupTiles &&
                  Format<StreamWeight::kNVFP4>::kChunkK == kStreamChunkK && Format<StreamWeight::kBF16>::kChunkK == kStreamChunkK,
              "plan_stream_rows counts rows of these");

// Streams chunks [wb, we) of `domain`'s rows laid end to end (C chunks per row) through this
// warp's cp.async ring (pl.stages - 1 chunks ahead, across row boundaries, so the pipeline never
// drains inside a unit), and leaves the sums of each row it touched in its row slot. Traced
// launches stamp kStreamTraceFirst into `trace` (if not nullptr) when its first chunk has landed.
template <StreamWeight F, int MB, int H, bool kTraced>
__device__ __forceinline__ void warp_stream(const StreamGemmArgs& a, const Plan& pl, int domain, int64_t wb, int64_t we,
                                            int64_t r_first, uint32_t ring, uint8_t* slots, int warp, int lane,
                                            unsigned long long* trace) {
  using Fmt = Format<F>;
  const int stages = pl.stages;
  constexpr int R = Fmt::kGroupTiles;
  const int64_t c = pl.chunks;
  const int n = static_cast<int>(we - wb);
  // The issue cursor (chunks are issued in order): the row being copied, its next chunk, and the
  // row's weight and activation sources.
  int64_t issue_row = wb / c;
  int issue_chunk = static_cast<int>(wb - issue_row * c);
  typename Fmt::Source src{};
  const uint16_t* x = nullptr;
  auto load_row = [&] {
    const Segment u = decode_row<H>(a, domain, issue_row);  // c0 = 0
    const StreamGemmPart& p = a.parts[u.part];
    src = Fmt::source(p, pl.chunks, u, lane);  // chunk 0 of the row
    x = (p.x ? p.x : a.x) + u.batch / p.x_entry_div * p.x_batch_stride;
  };
  load_row();
  int issue_stage = 0;       // the stage chunk j goes into: j % stages, kept incrementally
  auto issue = [&](int j) {  // chunk j of the range into its stage; always one commit group
    if (j < n) {
      if (issue_chunk == c) {
        ++issue_row;
        issue_chunk = 0;
        load_row();
      }
      const uint32_t slot = ring + issue_stage * pl.slot_bytes;
      if (++issue_stage == stages) issue_stage = 0;
      Fmt::issue_weights(slot, src, issue_chunk, a.k, lane);
      Fmt::template issue_x<MB>(slot + Fmt::kWeightBytes, x, a.x_ld, static_cast<int64_t>(issue_chunk) * Fmt::kChunkK,
                                a.k, a.m, lane);
      ++issue_chunk;
    }
    cp_async_commit();
  };
  RowSums<R, MB> sums;
  sums.start(wb, c);  // the compute cursor: the row of chunk j and its chunks left
  for (int j = 0; j < stages - 1; ++j) issue(j);
  int stage = 0;  // chunk j's stage
  for (int j = 0; j < n; ++j) {
    __syncwarp();  // every lane has read the stage that is refilled next
    issue(j + stages - 1);
    cp_async_wait_pending(stages - 1);
    __syncwarp();  // stages written by other lanes (NVFP4 scale codes) are visible
    if constexpr (kTraced) {
      if (j == 0 && lane == 0) stamp(trace, kStreamTraceFirst);
    }
    sums.next_chunk(slots, warp, r_first, lane);
    const uint32_t slot = ring + stage * pl.slot_bytes;
    if (++stage == stages) stage = 0;
    Fmt::template mma<MB>(slot, lane, a.m, sums.acc);
  }
  cp_async_wait<0>();
  __syncwarp();
  sums.leave(slots, warp, r_first, lane);
}


// Before the previous kernel in the stream has finished (programmatic dependent launch), a CTA
// asks L2 for up to pl.prefetch_bytes (kPrefetchBytes by default) of the weights of unit
// blockIdx.x of the domains' units laid end to end: with one domain its own first unit; with
// several a guess (units come from the counters), but the CTAs together ask for the first units of
// every domain, whoever streams them. Weights only: nothing the previous kernel writes is read
// here, and an L2 prefetch returns no data that could go stale. Only in launches that overlap the
// previous kernel: in a plain one it would just compete with the rings' first copies. (More is slower on the H200: 128-256 KB took 18432 x 7168 at M = 1 from 33.1 to
// 34.1-35.5 us, as the requests compete with the previous kernel's last CTAs, on which the wait
// depends; cuda_stream_timeline_bench --tuning 0,0,0,1,F.)

template <StreamWeight F, int H>
__device__ __forceinline__ void prefetch_first_unit(const StreamGemmArgs& a, const Plan& pl, int lane) {
  int64_t unit = blockIdx.x;
  int domain = 0;
  while (domain < a.num_domains && unit >= pl.units[domain]) unit -= pl.units[domain++];
  if (domain == a.num_domains) return;
  const int64_t c = pl.chunks;
  int64_t begin, end;
  unit_range(pl, domain, unit, &begin, &end);
  int64_t budget = pl.prefetch_bytes;
  for (int64_t r = begin / c; r * c < end && budget > 0; ++r) {
    Segment u = decode_row<H>(a, domain, r);
    int c1;
    row_chunks(c, r, begin, end, &u.c0, &c1);
    u.n = c1 - u.c0;
    const int64_t affordable = (budget + Format<F>::kWeightBytes - 1) / Format<F>::kWeightBytes;
    if (u.n > affordable) u.n = static_cast<int>(affordable);
    budget -= Format<F>::prefetch(a.parts[u.part], pl.chunks, a.k, u, lane);
  }
}

// Each CTA takes one unit at a time (own domain first, then the others'): its warps stream the
// unit's chunks, then finish_unit writes its rows' outputs or partials. kTraced: the form that
// stamps a timeline (StreamGemmTuning::trace); the stamps are compiled out of the other, which is
// the one that runs (present but switched off, they cost 2 % at M = 1 on the H200).
template <StreamWeight F, int MB, int H, int W, bool kTraced>
__global__ void __launch_bounds__(W * 32)
    stream_gemm_kernel(const __grid_constant__ StreamGemmArgs a, const __grid_constant__ Plan pl) {
  static_assert(Format<F>::kGroupTiles <= W, "a warp per tile in the reduction");
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_domain, s_unit;
  __shared__ unsigned s_last[kMaxUnitRows];
  __shared__ unsigned long long* s_trace;  // this CTA's timeline record, or nullptr
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + warp * pl.ring_bytes;
  uint8_t* slots = smem + W * pl.ring_bytes;  // the row slots (row_slot) after the W rings
  // Thread 0 stamps word w of the CTA's timeline record (traced launches only).
  auto mark = [&](int w) {
    if constexpr (kTraced) {
      if (threadIdx.x == 0) stamp(s_trace, w);
    }
  };
  if constexpr (kTraced) {
    if (threadIdx.x == 0) s_trace = open_trace_record(pl.trace, kStreamTraceWords);
  }
  launch_dependents();
  if (pl.overlapped && warp == 0) prefetch_first_unit<F, H>(a, pl, lane);
  wait_for_previous_grid();  // before the counters, activations, partials or outputs are touched
  mark(kStreamTraceWaited);

  const int home = home_domain(a.sm_domain, a.num_domains, kNoDomain);
  UnitQueue<Plan> q{pl, a.num_domains, home};
  if (threadIdx.x == 0) q.first(&s_domain, &s_unit);  // one domain: never fewer units than CTAs
  while (true) {
    __syncthreads();
    const int domain = s_domain, unit = s_unit;
    if (domain < 0) break;
    // The unit's chunks [begin, end) of the domain's rows laid end to end: warp w streams its
    // 1/W of them, then the CTA finishes the unit's row segments side by side.
    int64_t begin, end;
    unit_range(pl, domain, unit, &begin, &end);
    const int64_t r_first = begin / pl.chunks;
    const int64_t wb = begin + (end - begin) * warp / W, we = begin + (end - begin) * (warp + 1) / W;
    if (we > wb)
      warp_stream<F, MB, H, kTraced>(a, pl, domain, wb, we, r_first, ring, slots, warp, lane,
                                     kTraced && warp == 0 ? s_trace : nullptr);
    __syncthreads();
    mark(kStreamTraceStreamed);
    // Thread 0 asks for its next unit now, so that the round trip overlaps the unit's end.
    int ahead = -1;
    unsigned got = 0;
    if (threadIdx.x == 0 && pl.counted && (ahead = q.next_domain()) >= 0) got = atomicAdd(pl.counters + ahead, 1u);
    finish_unit<F, MB, H, W>(a, pl, domain, unit, begin, end, slots, warp, lane, s_last);  // ends with a barrier
    mark(kStreamTraceEnd);
    if (threadIdx.x == 0) {
      s_domain = -1;
      if (ahead >= 0 && q.accept(ahead, got, &s_unit)) s_domain = ahead;
      else q.take(&s_domain, &s_unit);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// host side

// Shared memory and residency of one kernel instantiation at M activation rows.
struct LaunchShape {
  int slot_bytes, stages, ring_bytes, smem_bytes, max_blocks;
  int unit_rows;  // rows one unit may touch
};
template <StreamWeight F, int MB, int H, int W>
LaunchShape launch_shape(int m, int sms, int unit_rows, int forced_stages) {
  LaunchShape ls{};
  ls.unit_rows = unit_rows;
  // A stage holds the chunk's weights and the activation rows that exist (16-byte multiples).
  ls.slot_bytes = Format<F>::kWeightBytes + m * Format<F>::kXRowBytes;
  // The W rings, then the row slots: W + unit_rows - 1 of R tiles x MB x 32 lanes x float4.
  const int slots_bytes = (W + unit_rows - 1) * Format<F>::kGroupTiles * MB * 512;
  ls.stages = forced_stages > 0 ? forced_stages
                                : ring_stages(ls.slot_bytes, W, slots_bytes, kMaxPipelineStages, shared_memory_per_sm());
  ls.ring_bytes = ls.stages * ls.slot_bytes;
  ls.smem_bytes = W * ls.ring_bytes + slots_bytes;
  ls.max_blocks = resident_ctas_per_sm(reinterpret_cast<const void*>(stream_gemm_kernel<F, MB, H, W, false>),
                                       reinterpret_cast<const void*>(stream_gemm_kernel<F, MB, H, W, true>), W * 32,
                                       ls.smem_bytes) *
                  sms;
  return ls;
}

// launch_shape with row slots for units that touch enough rows that the stream-K cut needs no
// second round of units (unit_rows_one_per_cta over the resident CTAs), where those slots keep
// the residency and the ring depth; else with unit_rows. A second round (a few units run after
// every other CTA is done) cost about a third of the call: the H100 trace of a decode step
// (docs/benchmarks.md, twentieth session) had DeepSeek-V3's dense gate/up (576 rows of 112 chunks:
// 287 units of at most 225 chunks for 264 CTAs) and its experts' by-id down projections (896 rows
// of 32 chunks: 442 units of at most 65) at 1.7-2.2x their weights' time.
template <StreamWeight F, int MB, int H, int W>
LaunchShape fitted_shape(int m, int sms, const StreamRows& work, int forced_stages) {
  const LaunchShape base = launch_shape<F, MB, H, W>(m, sms, unit_rows(work, W), forced_stages);
  if (base.max_blocks == 0) return base;
  const int rows = unit_rows_one_per_cta(work, base.max_blocks, W);
  if (rows <= base.unit_rows) return base;
  const LaunchShape wider = launch_shape<F, MB, H, W>(m, sms, rows, forced_stages);
  return wider.max_blocks == base.max_blocks && wider.stages == base.stages ? wider : base;
}

// Launches W-warp CTAs shaped `ls` over `sms` SMs.
template <StreamWeight F, int MB, int H, int W>
void launch_with(StreamGemmArgs& a, const StreamRows& work, const LaunchShape& ls, const StreamGemmTuning& t, int sms,
                 int64_t groups_total, int64_t rows_total, cudaStream_t stream) {
  constexpr int R = Format<F>::kGroupTiles;
  LOCUS_CHECK(ls.max_blocks >= 1, "streaming GEMM: ", ls.smem_bytes, " bytes of shared memory per ", W,
              "-warp CTA do not fit an SM");
  Plan pl{};
  const int blocks = plan_units(pl, a, work, sms, ls.max_blocks, W, H, t.units_per_cta, ls.unit_rows, groups_total,
                                rows_total, R * MB * 32, stream);
  pl.slot_bytes = ls.slot_bytes;
  pl.ring_bytes = ls.ring_bytes;
  pl.stages = ls.stages;
  // Parts that look their weights up on the device (weight_ids) read what the previous kernel
  // wrote, so they never start before it ends.
  bool indexed = false;
  for (int i = 0; i < a.num_parts; ++i) indexed = indexed || a.parts[i].weight_ids != nullptr;
  pl.overlapped = t.dependent_launch && !indexed && overlaps_previous(blocks, ls.max_blocks) ? 1 : 0;
  pl.prefetch_bytes = t.prefetch_kb > 0 ? t.prefetch_kb << 10 : kPrefetchBytes;
  pl.trace = t.trace;
  DependentLaunch launch(dim3(blocks), dim3(W * 32), ls.smem_bytes, stream, pl.overlapped != 0);
  auto* kernel = pl.trace.buf != nullptr ? stream_gemm_kernel<F, MB, H, W, true> : stream_gemm_kernel<F, MB, H, W, false>;
  LOCUS_CUDA_CHECK_NAMED(cudaLaunchKernelEx(&launch.config, kernel, a, pl), "streaming GEMM kernel launch");
}

template <StreamWeight F, int MB, int H>
void launch_typed(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total, int sms,
                  const StreamGemmTuning& t, cudaStream_t stream) {
  const int stages = t.feed == 0 ? t.stages : 0;  // a TMA ring depth (the feed declined the problem) is not ours
  const LaunchShape wide = fitted_shape<F, MB, H, kWideWarps>(a.m, sms, work, stages);
  // 8 warps may not fit at all (BF16 at M = 17..32: the rings and row slots exceed an SM).
  // The TMA feed's 16 consumer warps (the feed declined the problem) are not ours either, and
  // 8 warps asked for where they do not fit run as 4.
  int warps = t.warps == kNarrowWarps || t.warps == kWideWarps ? t.warps : 0;
  if (wide.max_blocks == 0) warps = kNarrowWarps;
  else if (warps == 0) warps = cta_warps(work, wide.max_blocks, sms);
  if (warps == kNarrowWarps) {
    const LaunchShape narrow = fitted_shape<F, MB, H, kNarrowWarps>(a.m, sms, work, stages);
    launch_with<F, MB, H, kNarrowWarps>(a, work, narrow, t, sms, groups_total, rows_total, stream);
  } else {
    launch_with<F, MB, H, kWideWarps>(a, work, wide, t, sms, groups_total, rows_total, stream);
  }
}

template <StreamWeight F, int H>
void launch_for_m(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total, int sms,
                  const StreamGemmTuning& t, cudaStream_t stream) {
  if (a.m <= 8) launch_typed<F, 1, H>(a, work, groups_total, rows_total, sms, t, stream);
  else if (a.m <= 16) launch_typed<F, 2, H>(a, work, groups_total, rows_total, sms, t, stream);
  else launch_typed<F, 4, H>(a, work, groups_total, rows_total, sms, t, stream);
}

}  // namespace

void launch_stream_gemm_rings(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total,
                              int sms, const StreamGemmTuning& t, cudaStream_t stream) {
  constexpr auto kNv = StreamWeight::kNVFP4, kBf = StreamWeight::kBF16;
  if (a.format == kNv) {
    a.swiglu ? launch_for_m<kNv, 2>(a, work, groups_total, rows_total, sms, t, stream)
             : launch_for_m<kNv, 1>(a, work, groups_total, rows_total, sms, t, stream);
  } else {
    a.swiglu ? launch_for_m<kBf, 2>(a, work, groups_total, rows_total, sms, t, stream)
             : launch_for_m<kBf, 1>(a, work, groups_total, rows_total, sms, t, stream);
  }
}

}  // namespace locus::cuda::detail
