// The MLA decode BMM fed by TMA (bmm_tma.h).
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <vector>

#include "backends/cuda/bmm_tma.h"
#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cta_trace.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/driver_api.h"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/persistent_alloc.h"
#include "backends/cuda/stream_gemm.h"
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/tma.cuh"
#include "backends/cuda/unit_queue.cuh"
#include "backends/cuda/wgmma.cuh"

namespace locus::cuda::detail {
namespace {

constexpr int kGroupWarps = 4;                       // a consumer warpgroup
constexpr int kConsumerGroups = 2;                   // they take alternate slots
constexpr int kConsumerWarps = kGroupWarps * kConsumerGroups;
constexpr int kThreads = 32 * (kConsumerWarps + 1);  // + the producer warp
constexpr int kSlotRows = 16 * kGroupWarps;          // weight rows per slot: a 16-row tile per warp of a group
constexpr int kBoxK = 64;                            // 128 bytes: the swizzle span
constexpr int kRowBytes = 128;                       // every box row in shared memory
constexpr int kMaxSlots = 8;
constexpr int kXBuffers = 2;
constexpr int kMaxKnBoxRows = 256;                   // a TMA box has at most 256 rows

struct BmmMaps {
  CUtensorMap y;                     // dims {N, M, H}, boxes {64, m_pad, 1} (no swizzle)
  CUtensorMap x;                     // dims {K, M, H}
  CUtensorMap w[kBmmTmaMaxParts];    // dims {K, N, heads} or, n_contiguous, {N, K, heads}
};

struct BmmPlan {
  int32_t k_pad;                            // K rounded up to 64
  int32_t kn_box_rows;                      // n_contiguous: K rows per weight box
  int32_t slot_bytes, x_bytes;              // per slot (64 rows x k_pad) and per x buffer (m_pad x k_pad)
  int32_t out_bytes;                        // per output staging buffer (m_pad x 64 outputs)
  int32_t out_buffers;                      // staging buffers per consumer group: 2, or 1 where memory is short
  int32_t slots, x_buffers;
  int32_t unit_rows, row_blocks;            // rows per unit (a multiple of 64) and units per head
  int32_t units[kBmmTmaMaxDomains];         // per domain: its parts' units end to end
  int32_t part_unit0[kBmmTmaMaxParts];      // a part's first unit in its domain
  unsigned* counters;                       // kQueuedUnits: per domain, 0 between launches
  unsigned* claims;                         // kRankUnits: [domain][rank] launches that claimed it
  unsigned long long* arrivals;             // kRankUnits: per CTA index, the launches it started in
  int32_t mode;                             // how units reach CTAs (kStaticUnits, ...)
  int32_t total_ctas, static_first, counted;
  CtaTrace trace;                           // BmmTmaTuning::trace
  int32_t early_copy;                       // BmmTmaTuning::early_copy: slots
};

// How the units reach the CTAs (bmm_tma.h): statically by block index (one domain), by SM rank
// within each domain, or from per-domain atomic counters.
enum : int32_t { kStaticUnits = 0, kRankUnits = 1, kQueuedUnits = 2 };
constexpr int kMaxRanks = 256;  // per domain (ranks are bytes)

// What the producer tells the consumers about a slot: its first row and head, its x buffer and
// that buffer's fill phase, and flags; row0 < 0 ends the loop.
struct SlotInfo {
  int32_t row0, head, x_buffer, flags;
};
// kSpeculative: copied before the CTA's rank was claimed; written out only if the claim held.
// Bits from kXReleaseShift on: for how many consumer groups this slot's group frees the unit's x
// buffer: one on each group's last slot of the unit, and on the unit's last slot one more for
// every group that takes none of its slots.
constexpr int kXPhase = 4, kSpeculative = 8, kXReleaseShift = 8;

struct Smem {
  uint64_t w_full[kMaxSlots], w_empty[kMaxSlots], x_full[kXBuffers], x_empty[kXBuffers];
  uint64_t claimed;  // completes once the producer knows whether the speculative unit is this CTA's
  SlotInfo info[kMaxSlots];
  int32_t claim_held;
  unsigned long long* trace;  // this CTA's timeline record, or nullptr
};

// The kernel's static shared memory (Smem) at most, however the compiler pads it.
constexpr int kStaticSmemBound = (sizeof(Smem) + 127) / 128 * 128;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The part, head within it and row block of unit u of `domain`.
__device__ __forceinline__ int decode_unit(const BmmTmaArgs& a, const BmmPlan& pl, int domain, int u, int* head,
                                           int* block) {
  int p = 0;
  for (int i = 0; i < a.num_parts; ++i)
    if (a.parts[i].domain == domain && u >= pl.part_unit0[i] && u < pl.part_unit0[i] + a.parts[i].heads * pl.row_blocks)
      p = i;
  const int local = u - pl.part_unit0[p];
  *head = local / pl.row_blocks;
  *block = local % pl.row_blocks;
  return p;
}

// Asks L2 for weight rows [r0, r1) of a head (the span from their first to their last element).
template <bool kNC>
__device__ __forceinline__ void prefetch_rows(const BmmTmaArgs& a, int p, int head, int r0, int r1) {
  if (r0 >= r1) return;
  const BmmTmaPart& part = a.parts[p];
  const char* base = static_cast<const char*>(part.w) + 2 * head * part.w_head_stride;
  const int64_t first = kNC ? r0 : r0 * part.w_row_stride;
  const int64_t last = kNC ? (a.k - 1) * part.w_row_stride + r1 : (r1 - 1) * part.w_row_stride + a.k;
  const int64_t bytes = ((last - first) * 2 + 15) & ~int64_t{15};
  if (bytes <= (int64_t{1} << 20)) prefetch_l2_bulk(base + (first * 2 & ~int64_t{15}), static_cast<uint32_t>(bytes));
}

// The producer (one thread): per unit, the head's activations into the next x buffer, then the
// unit's rows into the next slots.
template <bool kNC>
struct Producer {
  const BmmTmaArgs& a;
  const BmmPlan& pl;
  const BmmMaps& maps;
  Smem& s;
  uint32_t x_base, w_base;
  uint32_t item = 0, xi = 0;  // slots and x buffers filled so far
  // The unit being copied: its part, head (within the part and of the whole), x buffer, first
  // row, slots, the slots copied so far and its flags.
  int u_part = 0, u_head = 0, u_gh = 0, u_xb = 0, u_r0 = 0, u_slots = 0, u_done = 0, u_flags = 0;

  // Units opened whose activations are still to be copied (copy_x): at most one per x buffer, the
  // last x_owed opened (scalars, not an array: a dynamically indexed array would put the whole
  // producer in local memory, which made the kernel 1.3x slower).
  int x_owed = 0, owed_head0 = 0, owed_head1 = 0;
  static_assert(kXBuffers == 2, "one owed head per x buffer");

  // Takes the next x buffer for a unit (once its consumers freed it); its weights follow by
  // next_slot(), its activations by copy_x().
  __device__ void open(int domain, int unit, int extra_flags) {
    int block;
    u_part = decode_unit(a, pl, domain, unit, &u_head, &block);
    u_gh = a.parts[u_part].head0 + u_head;
    u_xb = static_cast<int>(xi % pl.x_buffers);
    if (xi >= static_cast<uint32_t>(pl.x_buffers)) mbar_wait(smem_addr(&s.x_empty[u_xb]), (xi / pl.x_buffers - 1) & 1);
    if (x_owed == 0) owed_head0 = u_gh;
    else owed_head1 = u_gh;
    ++x_owed;
    u_r0 = block * pl.unit_rows;
    u_slots = (min(a.n, u_r0 + pl.unit_rows) - u_r0 + kSlotRows - 1) / kSlotRows;
    u_done = 0;
    u_flags = ((xi / pl.x_buffers) & 1 ? kXPhase : 0) | extra_flags;
    ++xi;
  }
  // Copies the activations of the units opened so far (after the previous kernel: they may be
  // its outputs).
  __device__ void copy_x() {
    const int k_boxes = pl.k_pad / kBoxK;
#pragma unroll
    for (int i = 0; i < kXBuffers; ++i) {
      if (i >= x_owed) break;
      const int xb = static_cast<int>((xi - x_owed + i) % pl.x_buffers);
      const uint32_t x_full = smem_addr(&s.x_full[xb]), x_dst = x_base + xb * pl.x_bytes;
      mbar_expect(x_full, pl.x_bytes);
      for (int kb = 0; kb < k_boxes; ++kb)
        tensor_copy_3d(x_dst + kb * (pl.x_bytes / k_boxes), &maps.x, kb * kBoxK, 0, i == 0 ? owed_head0 : owed_head1,
                       x_full);
    }
    x_owed = 0;
  }
  // Opens units from `*unit` on (every `stride`-th, below `end`) until `slots` slots (at most the
  // ring) are filled or the x buffers would have to wait, copying each one's weights as far as the
  // ring takes them; *unit ends past the last one opened. Used before the previous kernel has
  // ended: weights are never its outputs. (A unit is copied whole, not cut at `slots`: on 128 x 512
  // x 128 in [K, N], MLA's k_b, half a unit before the wait took 7.6 us at M = 1, a whole one 6.8.)
  __device__ void open_early(int domain, int* unit, int stride, int end, int slots, int extra_flags) {
    const uint32_t enough = static_cast<uint32_t>(min(slots, pl.slots));
    while (*unit < end && xi < static_cast<uint32_t>(pl.x_buffers) && item < enough) {
      open(domain, *unit, extra_flags);
      *unit += stride;
      while (!unit_copied() && slot_free()) next_slot();
    }
  }

  __device__ bool unit_copied() const { return u_done == u_slots; }
  // Whether the next slot is free without waiting.
  __device__ bool slot_free() const { return item < static_cast<uint32_t>(pl.slots); }

  // The slot of the next item, once its consumers freed it from the item slots earlier.
  __device__ int acquire_slot() const {
    const int sl = static_cast<int>(item % pl.slots);
    if (item >= static_cast<uint32_t>(pl.slots)) mbar_wait(smem_addr(&s.w_empty[sl]), (item / pl.slots - 1) & 1);
    return sl;
  }

  // Copies the unit's next 64 weight rows into the next slot.
  __device__ void next_slot() {
    const int j = u_done++, row0 = u_r0 + j * kSlotRows;
    const int sl = acquire_slot();
    // Item i goes to group i % kConsumerGroups, so the unit's last kConsumerGroups slots are each a
    // different group's last.
    const int x_releases = (j >= u_slots - kConsumerGroups) + (j == u_slots - 1 ? max(0, kConsumerGroups - u_slots) : 0);
    s.info[sl] = SlotInfo{row0, u_gh, u_xb, (x_releases << kXReleaseShift) | u_flags};
    const uint32_t full = smem_addr(&s.w_full[sl]), dst = w_base + sl * pl.slot_bytes;
    mbar_expect(full, pl.slot_bytes);
    if (kNC) {
      for (int kr = 0; kr < pl.k_pad; kr += pl.kn_box_rows)
        tensor_copy_3d(dst + kr * kRowBytes, &maps.w[u_part], row0, kr, u_head, full);
    } else {
      for (int kb = 0; kb < pl.k_pad / kBoxK; ++kb)
        tensor_copy_3d(dst + kb * kSlotRows * kRowBytes, &maps.w[u_part], kb * kBoxK, row0, u_head, full);
    }
    ++item;
  }

  // The rest of the open unit.
  __device__ void complete() {
    while (!unit_copied()) next_slot();
  }
  // A whole unit.
  __device__ void issue(int domain, int unit, int extra_flags) {
    open(domain, unit, extra_flags);
    copy_x();
    complete();
  }

  // Asks L2 for a whole unit's weights (BmmTmaTuning::early_copy = 0).
  __device__ void prefetch(int domain, int unit) const {
    int head, block;
    const int p = decode_unit(a, pl, domain, unit, &head, &block);
    prefetch_rows<kNC>(a, p, head, block * pl.unit_rows, min(a.n, (block + 1) * pl.unit_rows));
  }
  // Asks L2 for the open unit's rows not copied yet (before the previous kernel ends: weights are
  // not its outputs); the rows being copied need no second request.
  __device__ void prefetch_rest() const {
    if (unit_copied()) return;
    prefetch_rows<kNC>(a, u_part, u_head, u_r0 + u_done * kSlotRows, min(a.n, u_r0 + pl.unit_rows));
  }

  // The next slot of each consumer group says "no more".
  __device__ void finish() {
    for (int g = 0; g < kConsumerGroups; ++g, ++item) {
      const int sl = acquire_slot();
      s.info[sl].row0 = -1;
      mbar_arrive(smem_addr(&s.w_full[sl]));
    }
  }
};

// Claims a rank for launch `launch`, own domain first: true when rank (*domain, *rank) was free.
__device__ __forceinline__ bool claim_rank(const BmmTmaArgs& a, const BmmPlan& pl, unsigned launch, int domain, int rank) {
  return atomicCAS(pl.claims + domain * kMaxRanks + rank, launch, launch + 1) == launch;
}
// Any free rank, home domain first. A rank is free while its claim word equals `launch` (words
// only go from `launch` to `launch + 1` during a launch, and the previous launch has ended), so the
// words are read a batch at a time (independent L2 reads, one round trip per batch) and only those
// that look free are tried. A scan of one atomicCAS after another pays an L2 round trip per rank
// already taken, for every CTA whose own rank was not free (where some SMs are in no domain, the
// CTAs that land there and those they displace).
__device__ void claim_any_rank(const BmmTmaArgs& a, const BmmPlan& pl, unsigned launch, int* domain, int* rank) {
  constexpr int kBatch = 16;
  const int home = *domain >= 0 ? *domain : 0;
  for (int i = 0; i < a.num_domains; ++i) {
    const int d = (home + i) % a.num_domains;
    const unsigned* words = pl.claims + d * kMaxRanks;
    for (int r0 = 0; r0 < a.domain_sms[d]; r0 += kBatch) {
      unsigned seen[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) seen[j] = r0 + j < a.domain_sms[d] ? __ldcg(words + r0 + j) : launch + 1;
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (seen[j] == launch && claim_rank(a, pl, launch, d, r0 + j)) {
          *domain = d;
          *rank = r0 + j;
          return;
        }
    }
  }
  // Unreachable: a launch has as many CTAs as ranks, so while this CTA holds none, some rank is
  // free, and one pass sees every rank either taken for good or free.
  *domain = -1;
}

// Stamps word `w` of the CTA's timeline record; compiled out of the untraced kernel form.
template <bool kTraced>
__device__ __forceinline__ void mark(const Smem& s, int w) {
  if constexpr (kTraced) stamp(s.trace, w);
}

template <bool kNC, bool kTraced>
__device__ void produce(const BmmTmaArgs& a, const BmmPlan& pl, const BmmMaps& maps, Smem& s, uint32_t x_base,
                        uint32_t w_base) {
  Producer<kNC> pr{a, pl, maps, s, x_base, w_base};
  if (pl.mode == kStaticUnits) {
    int u = static_cast<int>(blockIdx.x);
    if (pl.early_copy) pr.open_early(0, &u, pl.total_ctas, pl.units[0], pl.early_copy, 0);
    else pr.prefetch(0, u);
    pr.prefetch_rest();
    wait_for_previous_grid();  // before the activations
    mark<kTraced>(s, kTraceWaited);
    mark<kTraced>(s, kTraceGo);
    pr.copy_x();
    pr.complete();
    for (; u < pl.units[0]; u += pl.total_ctas) pr.issue(0, u, 0);
  } else if (pl.mode == kRankUnits) {
    const unsigned smid = sm_id();
    int domain = smid < 1024 ? a.sm_domain[smid] : kNoDomain, rank = smid < 1024 ? a.sm_rank[smid] : 0;
    const bool guess = domain < a.num_domains && rank < a.domain_sms[domain];
    if (!guess) domain = -1;
    const bool speculate = guess && rank < pl.units[domain];
    // The guessed rank's units, as far as the ring takes them without waiting (consumers hold
    // speculative slots until the claim is known); the rest follows the claim.
    int u = rank;
    if (speculate) {
      if (pl.early_copy) pr.open_early(domain, &u, a.domain_sms[domain], pl.units[domain], pl.early_copy, kSpeculative);
      else pr.prefetch(domain, rank);
      pr.prefetch_rest();
    }
    wait_for_previous_grid();  // before the activations and the claims
    mark<kTraced>(s, kTraceWaited);
    // Every launch adds one to its CTA b's word b (a word of its own: no CTA waits behind
    // another's addition) and claims every rank once: the launch's number.
    const unsigned long long arrival = atomicAdd(pl.arrivals + blockIdx.x, 1ull);
    if (speculate && !pl.early_copy) pr.open_early(domain, &u, a.domain_sms[domain], rank + 1, pl.slots, kSpeculative);
    pr.copy_x();
    const unsigned launch = static_cast<unsigned>(arrival);
    const bool held = guess && claim_rank(a, pl, launch, domain, rank);
    if (!held) claim_any_rank(a, pl, launch, &domain, &rank);
    s.claim_held = held;
    mbar_arrive(smem_addr(&s.claimed));
    mark<kTraced>(s, kTraceGo);
    pr.complete();  // the last speculative unit
    if (domain >= 0)
      for (u = held ? u : rank; u < pl.units[domain]; u += a.domain_sms[domain]) pr.issue(domain, u, 0);
  } else {
    UnitQueue<BmmPlan> q{pl, a.num_domains, home_domain(a.sm_domain, a.num_domains, kNoDomain)};
    wait_for_previous_grid();  // before the counters and the activations
    mark<kTraced>(s, kTraceWaited);
    int domain, unit;
    q.first(&domain, &unit);
    mark<kTraced>(s, kTraceGo);
    for (; domain >= 0; q.take(&domain, &unit)) pr.issue(domain, unit, 0);
  }
  pr.finish();
}

// A barrier of one consumer group's warps (named barrier 1 + group; the others never wait on it).
__device__ __forceinline__ void group_sync(int group) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "n"(32 * kGroupWarps) : "memory");
}
__device__ __forceinline__ void sts16(uint32_t addr, unsigned short v) {
  asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// Warp `warp` of consumer group `group`: rows 16 warp .. 16 warp + 15 of the group's slots (items
// group, group + 2, ...), NT groups of 8 tokens.
template <int NT, bool kNC, bool kTraced>
__device__ void consume(const BmmTmaArgs& a, const BmmPlan& pl, const BmmMaps& maps, Smem& s, uint32_t x_base,
                        uint32_t w_base, uint32_t out_base, int group, int warp, int lane) {
  constexpr int kMPad = 8 * NT;
  const int steps = pl.k_pad / 16;
  // Per-lane parts of the ldmatrix addresses (128-byte swizzle: chunk c of row r sits at
  // r * 128 + ((c ^ (r % 8)) * 16) within each 1024-byte aligned box).
  const int sw = lane & 7, quad = lane >> 3;
  uint32_t a_off[4];  // weights, per k step within a 64-K box ([N, K]) or per k step ([K, N])
  if (kNC) {
    // matrix q: k rows 8 (q >> 1) + sw, n chunk 2 warp + (q & 1); .trans turns them into A fragments
    a_off[0] = (8 * (quad >> 1) + sw) * kRowBytes + (((2 * warp + (quad & 1)) ^ sw) << 4);
  } else {
    // rows 16 warp + (lane & 15), chunk 2 step + (lane >> 4)
    const int row = 16 * warp + (lane & 15);
#pragma unroll
    for (int st = 0; st < 4; ++st) a_off[st] = row * kRowBytes + (((2 * st + (lane >> 4)) ^ sw) << 4);
  }
  // Activations: matrix q = token group (q >> 1) of a pair, chunk 2 step + (q & 1).
  uint32_t b_off[4];
#pragma unroll
  for (int st = 0; st < 4; ++st) b_off[st] = (8 * (quad >> 1) + sw) * kRowBytes + (((2 * st + (quad & 1)) ^ sw) << 4);
  const int x_box = kMPad * kRowBytes;  // one 64-K box of the activations
  const int g = lane >> 2, t = lane & 3;
  uint32_t stores = 0;  // output tiles stored so far (they take the group's staging buffers in turn)
  const bool leader = threadIdx.x == 32 * kGroupWarps * group;  // issues the group's TMA stores

  for (uint32_t item = group;; item += kConsumerGroups) {
    const int sl = static_cast<int>(item % pl.slots);
    mbar_wait(smem_addr(&s.w_full[sl]), (item / pl.slots) & 1);
    if (leader && item < kConsumerGroups) mark<kTraced>(s, group ? kTraceFirst1 : kTraceFirst0);
    const SlotInfo info = s.info[sl];
    if (info.row0 < 0) break;
    // The x buffer's fill for this unit has landed (an earlier wait of this fill returns at once:
    // the buffer is not refilled before both groups free it).
    mbar_wait(smem_addr(&s.x_full[info.x_buffer]), (info.flags & kXPhase) ? 1 : 0);
    const uint32_t w = w_base + sl * pl.slot_bytes, x = x_base + info.x_buffer * pl.x_bytes;
    float acc[NT][4] = {};
    // The warp's A fragments of k step kb * 4 + st.
    auto load_a = [&](int kb, int st, uint32_t (&af)[4]) {
      if (kNC) ldmatrix_x4_trans(w + (kb * 4 + st) * 16 * kRowBytes + a_off[0], af);
      else ldmatrix_x4(w + kb * kSlotRows * kRowBytes + a_off[st], af);
    };
#if LOCUS_WGMMA
    if constexpr (NT >= 4) {
      // 32 or 64 tokens: per 64-K box, wgmma with the four k steps' A fragments from registers and
      // the tokens straight from the swizzled x buffer; each box's group is waited for before the
      // next box's fragments are loaded (a running wgmma reads its A registers).
      float(&d)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(acc);
      for (int kb = 0; kb < steps / 4; ++kb) {
        uint32_t af[4][4];
#pragma unroll
        for (int st = 0; st < 4; ++st) load_a(kb, st, af[st]);
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < 4; ++st)
          wgmma_bf16_rs<NT>(d, af[st][0], af[st][1], af[st][2], af[st][3], wgmma_desc_k128(x + kb * x_box + 32 * st),
                            kb > 0 || st > 0);
        wgmma_commit();
        wgmma_wait<0>();
      }
      wgmma_keep(d);
    } else
#endif
    {
      for (int kb = 0; kb < steps / 4; ++kb) {
#pragma unroll
        for (int st = 0; st < 4; ++st) {
          uint32_t af[4];
          load_a(kb, st, af);
          const uint32_t xk = x + kb * x_box + b_off[st];
          if constexpr (NT == 1) {
            uint32_t bf[2];
            ldmatrix_x2(xk, bf);
            mma_bf16_16816(acc[0], af[0], af[1], af[2], af[3], bf[0], bf[1]);
          } else {
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
              uint32_t bf[4];
              ldmatrix_x4(xk + j * 8 * kRowBytes, bf);
              mma_bf16_16816(acc[j], af[0], af[1], af[2], af[3], bf[0], bf[1]);
              mma_bf16_16816(acc[j + 1], af[0], af[1], af[2], af[3], bf[2], bf[3]);
            }
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(smem_addr(&s.w_empty[sl]));
      const int x_releases = info.flags >> kXReleaseShift;
      if (x_releases > 0) mbar_arrive(smem_addr(&s.x_empty[info.x_buffer]), x_releases);
    }
    if (info.flags & kSpeculative) {
      mbar_wait(smem_addr(&s.claimed), 0);
      if (!*static_cast<volatile int32_t*>(&s.claim_held)) continue;  // another CTA writes this unit
    }
    // acc[j]: rows g and g + 8 of the warp's tile, tokens 8 j + 2 t and + 1.
    const int n_lo = 16 * warp + g;
    if constexpr (NT <= 2) {  // up to 16 tokens: a few stores per lane, straight to y
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = info.row0 + n_lo + (e >> 1) * 8, m = 8 * j + 2 * t + (e & 1);
          if (n >= a.n || m >= a.m) continue;
          const int64_t at = info.head * a.y_head_stride + m * a.y_row_stride + n;
          if (a.y_f32) static_cast<float*>(a.y)[at] = acc[j][e];
          else static_cast<__nv_bfloat16*>(a.y)[at] = __float2bfloat16_rn(acc[j][e]);
        }
      continue;
    }
    // More tokens: the slot's outputs [m_pad tokens][64 rows] go to a staging buffer and out by one
    // TMA store (whole lines; the tensor map drops what lies past M or N), not as 16-byte pieces.
    // The group's leader waits for the buffer's last store (one or two tiles ago) to have read it.
    const uint32_t out = out_base + (group * pl.out_buffers + stores % pl.out_buffers) * pl.out_bytes;
    if (leader) {
      if (pl.out_buffers == 2) bulk_wait_read<1>();
      else bulk_wait_read<0>();
    }
    group_sync(group);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int at = (8 * j + 2 * t + (e & 1)) * 64 + n_lo + (e >> 1) * 8;
        if (a.y_f32) sts32(out + at * 4, __float_as_uint(acc[j][e]));
        else sts16(out + at * 2, __bfloat16_as_ushort(__float2bfloat16_rn(acc[j][e])));
      }
    fence_proxy_async_shared();  // the writes are seen by the TMA store
    group_sync(group);
    if (leader) {
      tensor_store_3d(&maps.y, out, info.row0, 0, info.head);
      bulk_commit();
    }
    ++stores;
  }
  if (leader) {
    bulk_wait_all();
    mark<kTraced>(s, group ? kTraceEnd1 : kTraceEnd0);
  }
}

// kTraced: the form that stamps a timeline (BmmTmaTuning::trace); the stamps are compiled out of the
// other, which is the one that runs (in the streaming GEMM, stamps present but switched off cost 2 %).
template <int NT, bool kNC, bool kTraced>
__global__ void __launch_bounds__(kThreads, 1)
    bmm_tma_kernel(const __grid_constant__ BmmTmaArgs a, const __grid_constant__ BmmPlan pl,
                   const __grid_constant__ BmmMaps maps) {
  extern __shared__ uint8_t smem[];
  __shared__ Smem s;
  const uint32_t x_base = (smem_addr(smem) + 1023u) & ~1023u;  // the swizzle needs 1024-byte aligned boxes
  const uint32_t w_base = x_base + pl.x_buffers * pl.x_bytes;
  const uint32_t out_base = w_base + pl.slots * pl.slot_bytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    s.trace = kTraced ? open_trace_record(pl.trace, kBmmTraceWords) : nullptr;
    for (int i = 0; i < pl.slots; ++i) {
      mbar_init(smem_addr(&s.w_full[i]), 1);
      mbar_init(smem_addr(&s.w_empty[i]), kGroupWarps);  // one group takes a slot
    }
    for (int i = 0; i < pl.x_buffers; ++i) {
      mbar_init(smem_addr(&s.x_full[i]), 1);
      mbar_init(smem_addr(&s.x_empty[i]), kConsumerWarps);  // both groups free a unit's x
    }
    mbar_init(smem_addr(&s.claimed), 1);
    mbar_init_fence();
  }
  if (warp == kConsumerWarps && lane == 0) {
    prefetch_tensor_map(&maps.x);
    prefetch_tensor_map(&maps.y);
    for (int i = 0; i < a.num_parts; ++i) prefetch_tensor_map(&maps.w[i]);
  }
  __syncthreads();
  launch_dependents();
  if (warp == kConsumerWarps) {
    if (lane == 0) produce<kNC, kTraced>(a, pl, maps, s, x_base, w_base);
    return;
  }
  wait_for_previous_grid();  // before the outputs are written
  consume<NT, kNC, kTraced>(a, pl, maps, s, x_base, w_base, out_base, warp / kGroupWarps, warp % kGroupWarps, lane);
}

// ---------------------------------------------------------------------------------------------
// host side

int optin_smem(int device) { return device_attribute(device, cudaDevAttrMaxSharedMemoryPerBlockOptin); }

bool stride_ok(int64_t elements) { return elements > 0 && elements % 8 == 0 && elements < (int64_t{1} << 38); }

BmmTmaTuning g_tuning;

// A 3D BF16 (or fp32) tensor map, by default with 128-byte swizzled boxes; elements outside the
// tensor read as zeros and are not written. An encode is a function of its inputs alone, so maps
// are remembered by them: a decode step's weights never move, and the caching allocator hands
// its activations the same addresses step after step (the memo is cleared when it grows large).
CUtensorMap encode_tensor_map_3d(const void* base, const int64_t (&dims)[3], const int64_t (&strides)[2],
                                 const int (&box)[3], bool f32, bool swizzle);

CUtensorMap tensor_map_3d(const void* base, const int64_t (&dims)[3], const int64_t (&strides)[2],
                          const int (&box)[3], bool f32 = false, bool swizzle = true) {
  using Key = std::array<int64_t, 12>;  // no allocation on a launch's path
  static std::mutex mu;
  static auto* memo = new std::map<Key, CUtensorMap>();  // leaked, as the other launch caches
  const Key key{reinterpret_cast<int64_t>(base), dims[0], dims[1], dims[2], strides[0], strides[1], box[0], box[1],
                box[2], f32, swizzle, g_tuning.l2_promotion};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = memo->find(key); it != memo->end()) return it->second;
  const CUtensorMap map = encode_tensor_map_3d(base, dims, strides, box, f32, swizzle);  // throws on a bad map
  if (memo->size() >= 4096) memo->clear();
  memo->emplace(key, map);
  return map;
}

CUtensorMap encode_tensor_map_3d(const void* base, const int64_t (&dims)[3], const int64_t (&strides)[2],
                                 const int (&box)[3], bool f32, bool swizzle) {
  CUtensorMap map{};
  const int es = f32 ? 4 : 2;
  const cuuint64_t d[3] = {static_cast<cuuint64_t>(dims[0]), static_cast<cuuint64_t>(dims[1]),
                           static_cast<cuuint64_t>(dims[2])};
  const cuuint64_t st[2] = {static_cast<cuuint64_t>(strides[0] * es), static_cast<cuuint64_t>(strides[1] * es)};
  const cuuint32_t b[3] = {static_cast<cuuint32_t>(box[0]), static_cast<cuuint32_t>(box[1]),
                           static_cast<cuuint32_t>(box[2])};
  const cuuint32_t one[3] = {1, 1, 1};
  check_cu(driver().cuTensorMapEncodeTiled(&map, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                           3, const_cast<void*>(base), d, st, b, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                           swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                           g_tuning.l2_promotion == 0     ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                                           : g_tuning.l2_promotion == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                                          : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
           "cuTensorMapEncodeTiled (BMM)");
  return map;
}

int m_groups(int m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

int ctas_per_sm(const BmmTmaArgs& a) { return a.num_domains == 1 && g_tuning.ctas_per_sm > 1 ? g_tuning.ctas_per_sm : 1; }

int current_device() {
  int device = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// The ring, x buffers and staging buffers of `pl` for `per_sm` CTAs sharing an SM's memory, of
// which `streaming` (this launch's) share the 128 KB in flight; pl->slots < kConsumerGroups when
// they do not fit.
void size_ring(const BmmTmaArgs& a, int device, int per_sm, int streaming, BmmPlan* plan) {
  BmmPlan& pl = *plan;
  const int room = per_sm == 1 ? optin_smem(device)
                                : device_attribute(device, cudaDevAttrMaxSharedMemoryPerMultiprocessor) / per_sm - 1024;
  // Two staging buffers per group, or one where two leave no room for two slots (K = 512 with
  // 33-64 tokens and fp32 outputs).
  for (pl.out_buffers = 2; pl.out_buffers >= 1; --pl.out_buffers) {
    const int budget = room - 1024 - kStaticSmemBound - kConsumerGroups * pl.out_buffers * pl.out_bytes;
    pl.x_buffers = 2 * pl.x_bytes + 2 * pl.slot_bytes <= budget ? 2 : 1;
    // About 128 KB of weights in flight per SM covers the memory latency.
    // (The benchmark knob sets the count, within the memory.)
    const int wanted = g_tuning.slots >= 2 ? g_tuning.slots : std::max(2, (128 << 10) / (pl.slot_bytes * streaming));
    pl.slots = std::min({kMaxSlots, wanted, (budget - pl.x_buffers * pl.x_bytes) / pl.slot_bytes});
    // A whole number of slots per group, so that every slot is always the same group's: a group
    // tells a slot's fills apart by phase parity alone, which is sound only where the slot's
    // previous fill was one it consumed itself (and so has landed). With 3 slots, a group waiting
    // for item i could take the unlanded fill of item i - 3, the other group's, for its own.
    pl.slots -= pl.slots % kConsumerGroups;
    if (pl.slots >= kConsumerGroups) break;
  }
}

// Slot and buffer sizes for the problem; slots < kConsumerGroups when it does not fit the device.
BmmPlan size_plan(const BmmTmaArgs& a, int device) {
  BmmPlan pl{};
  pl.k_pad = (a.k + kBoxK - 1) / kBoxK * kBoxK;
  const int kn_boxes = (pl.k_pad + kMaxKnBoxRows - 1) / kMaxKnBoxRows;
  pl.kn_box_rows = pl.k_pad / kn_boxes;  // a multiple of 32: k_pad is of 64 and kn_boxes <= 2
  pl.slot_bytes = kSlotRows * pl.k_pad * 2;
  pl.x_bytes = 8 * m_groups(a.m) * pl.k_pad * 2;
  pl.out_bytes = 8 * m_groups(a.m) * 64 * (a.y_f32 ? 4 : 2);
  // One CTA per SM, or (benchmark knob, one domain only) several sharing its memory and the
  // 128 KB in flight; 1024: alignment slack (and the runtime's share per CTA when several).
  // BmmTmaTuning::beside_next sizes for twice as many (the next launch's CTAs beside these) and
  // falls back to the usual size where that leaves no room for two slots.
  const bool beside = g_tuning.beside_next < 0 ? a.num_domains > 1 : g_tuning.beside_next != 0;
  for (const int per_sm : {ctas_per_sm(a) * (beside ? 2 : 1), ctas_per_sm(a)}) {
    size_ring(a, device, per_sm, ctas_per_sm(a), &pl);
    if (pl.slots >= kConsumerGroups) break;
  }
  return pl;
}

// Whether the units can be dealt out by rank: rank tables, and SMs in every domain with work.
bool by_rank(const BmmTmaArgs& a, const BmmPlan& pl) {
  if (a.sm_domain == nullptr || a.sm_rank == nullptr) return false;
  for (int d = 0; d < a.num_domains; ++d)
    if (a.domain_sms[d] < 0 || a.domain_sms[d] > kMaxRanks || (pl.units[d] > 0 && a.domain_sms[d] == 0)) return false;
  return true;
}

// The rank claims and arrival words of the launches on `stream` with these ranks (the table and
// the SMs per domain: every such launch has one CTA per rank, adds one to each CTA's arrival word
// and claims each rank once, so the counts advance in step); zero at first.
void rank_claims(cudaStream_t stream, const BmmTmaArgs& a, BmmPlan* pl) {
  static std::mutex mu;
  static auto* all = new std::map<std::vector<int64_t>, void*>();
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  std::vector<int64_t> key{dev, reinterpret_cast<int64_t>(stream), reinterpret_cast<int64_t>(a.sm_rank), a.num_domains};
  key.insert(key.end(), a.domain_sms, a.domain_sms + a.num_domains);
  std::lock_guard<std::mutex> lock(mu);
  void*& buf = (*all)[key];
  constexpr size_t kRanks = size_t{kBmmTmaMaxDomains} * kMaxRanks;  // at least a launch's CTAs
  if (buf == nullptr)
    buf = persistent_device_alloc((sizeof(unsigned long long) + sizeof(unsigned)) * kRanks, nullptr,
                                  "allocating the BMM kernel's rank claims");
  pl->arrivals = static_cast<unsigned long long*>(buf);
  pl->claims = reinterpret_cast<unsigned*>(pl->arrivals + kRanks);
}

// The dynamic shared memory a launch of plan `pl` asks for. With one CTA an SM (all but the
// one-domain knob BmmTmaTuning::ctas_per_sm) that is more than half an SM's, even where the ring
// is smaller (BmmTmaTuning::beside_next, small K): two of the launch's own CTAs on one SM would
// stream at half its bandwidth and leave another SM without a CTA. Launched behind a busy kernel,
// the first SMs it frees would take two each (H100, 2026-12-07: the two-domain launch at K = 128
// timed 21.1-22.4 us behind the path choice's L2 read, 8.5-9.5 with one CTA an SM). The rest of
// the SM stays room for the next launch's CTAs.
int launch_smem_bytes(const BmmTmaArgs& a, const BmmPlan& pl, int device) {
  // x buffers, ring, output staging, and 1024 bytes of alignment slack
  const int buffers =
      pl.x_buffers * pl.x_bytes + pl.slots * pl.slot_bytes + kConsumerGroups * pl.out_buffers * pl.out_bytes + 1024;
  if (ctas_per_sm(a) > 1) return buffers;
  const int sm = device_attribute(device, cudaDevAttrMaxSharedMemoryPerMultiprocessor);
  const int reserved = device_attribute(device, cudaDevAttrReservedSharedMemoryPerBlock);
  return std::max(buffers, sm / 2 - reserved + 128);
}

template <int NT, bool kNC>
void launch_typed(const BmmTmaArgs& a, BmmPlan& pl, const BmmMaps& maps, int heads_total, cudaStream_t stream) {
  const int smem_bytes = launch_smem_bytes(a, pl, current_device());
  // Allow every size size_plan may pick (both forms: untraced, traced); the carveout that leaves
  // the rest of the SM to shared memory, where the next launch's CTAs may need it.
  for (auto* k : {bmm_tma_kernel<NT, kNC, false>, bmm_tma_kernel<NT, kNC, true>}) {
    raise_dynamic_smem_limit(reinterpret_cast<const void*>(k), max_dynamic_smem(reinterpret_cast<const void*>(k)));
    prefer_most_shared_memory(reinterpret_cast<const void*>(k));
  }
  const int max_ctas = sm_count_for(stream) * ctas_per_sm(a);  // one CTA per SM unless a knob says more
  // Units: heads cut into the fewest equal row blocks (a power of two) that give every CTA one.
  const int tiles = (a.n + kSlotRows - 1) / kSlotRows;
  int splits = 1;
  while (splits < tiles && heads_total * splits < max_ctas) splits *= 2;
  if (g_tuning.splits > 0) splits = g_tuning.splits;
  splits = std::min(splits, tiles);
  pl.unit_rows = (tiles + splits - 1) / splits * kSlotRows;
  pl.row_blocks = (a.n + pl.unit_rows - 1) / pl.unit_rows;
  int64_t units_total = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    const BmmTmaPart& p = a.parts[i];
    pl.part_unit0[i] = pl.units[p.domain];
    pl.units[p.domain] += p.heads * pl.row_blocks;
    units_total += p.heads * pl.row_blocks;
  }
  int ctas = static_cast<int>(std::min<int64_t>(max_ctas, units_total));
  pl.mode = a.num_domains == 1 ? kStaticUnits : by_rank(a, pl) ? kRankUnits : kQueuedUnits;
  if (pl.mode == kRankUnits) {
    ctas = 0;  // one per rank
    for (int d = 0; d < a.num_domains; ++d) ctas += a.domain_sms[d];
    rank_claims(stream, a, &pl);
  } else if (pl.mode == kQueuedUnits) {
    pl.static_first = 0;
    pl.counted = 1;
    pl.counters = stream_scratch(stream, kBmmTmaMaxDomains, 0).counters;
  }
  pl.total_ctas = ctas;
  pl.trace = g_tuning.trace;
  pl.early_copy = g_tuning.early_copy;
  DependentLaunch launch(dim3(ctas), dim3(kThreads), smem_bytes, stream, g_tuning.dependent_launch != 0);
  auto* kernel = pl.trace.buf != nullptr ? bmm_tma_kernel<NT, kNC, true> : bmm_tma_kernel<NT, kNC, false>;
  LOCUS_CUDA_CHECK_NAMED(cudaLaunchKernelEx(&launch.config, kernel, a, pl, maps), "BMM TMA kernel launch");
}

template <bool kNC>
void launch_for_m(const BmmTmaArgs& a, BmmPlan& pl, const BmmMaps& maps, int heads, cudaStream_t stream) {
  switch (m_groups(a.m)) {
    case 1: return launch_typed<1, kNC>(a, pl, maps, heads, stream);
    case 2: return launch_typed<2, kNC>(a, pl, maps, heads, stream);
    case 4: return launch_typed<4, kNC>(a, pl, maps, heads, stream);
    default: return launch_typed<8, kNC>(a, pl, maps, heads, stream);
  }
}

// The launch plan of `a` on `device` (its sizes; the rest is filled at launch); false when the
// kernel cannot take the problem there.
bool plan_launch(const BmmTmaArgs& a, int device, BmmPlan* pl) {
  if (a.m < 1 || a.m > kBmmTmaMaxM || a.k < 1 || a.k > kBmmTmaMaxK || a.n < 1) return false;
  if (a.num_parts < 1 || a.num_parts > kBmmTmaMaxParts || a.num_domains < 1 || a.num_domains > kBmmTmaMaxDomains)
    return false;
  if (!aligned16(a.x) || !aligned16(a.y)) return false;
  if ((a.m > 1 && !stride_ok(a.x_row_stride)) || !stride_ok(a.x_head_stride)) return false;
  // y: strides of whole 16 bytes (fp32: 4 elements would do; 8 keeps one rule)
  if ((a.m > 1 && !stride_ok(a.y_row_stride)) || !stride_ok(a.y_head_stride)) return false;
  for (int i = 0; i < a.num_parts; ++i) {
    const BmmTmaPart& p = a.parts[i];
    if (!aligned16(p.w) || p.heads < 1 || p.head0 < 0 || p.domain < 0 || p.domain >= a.num_domains) return false;
    if (!stride_ok(p.w_row_stride) || (p.heads > 1 && !stride_ok(p.w_head_stride))) return false;
  }
  if (!device_has_tma(device)) return false;
  *pl = size_plan(a, device);
  return pl->slots >= kConsumerGroups;
}

// Launches `a` with its plan `pl` (plan_launch's).
void launch_planned(const BmmTmaArgs& a, BmmPlan& pl, cudaStream_t stream) {
  int heads = 0;
  for (int i = 0; i < a.num_parts; ++i) heads = std::max(heads, a.parts[i].head0 + a.parts[i].heads);
  BmmMaps maps{};
  const int m_pad = 8 * m_groups(a.m);
  const int64_t x_row = a.m > 1 ? a.x_row_stride : (a.k + 7) / 8 * 8;  // one row: its stride is never used
  maps.x = tensor_map_3d(a.x, {a.k, a.m, heads}, {x_row, a.x_head_stride}, {kBoxK, m_pad, 1});
  const int64_t y_row = a.m > 1 ? a.y_row_stride : (a.n + 7) / 8 * 8;
  maps.y = tensor_map_3d(a.y, {a.n, a.m, heads}, {y_row, a.y_head_stride}, {kSlotRows, m_pad, 1}, a.y_f32, false);
  for (int i = 0; i < a.num_parts; ++i) {
    const BmmTmaPart& p = a.parts[i];
    const int64_t rows = a.n_contiguous ? a.k : a.n;
    const int64_t head_stride = p.heads > 1 ? p.w_head_stride : rows * p.w_row_stride;
    maps.w[i] = a.n_contiguous
                    ? tensor_map_3d(p.w, {a.n, a.k, p.heads}, {p.w_row_stride, head_stride}, {kBoxK, pl.kn_box_rows, 1})
                    : tensor_map_3d(p.w, {a.k, a.n, p.heads}, {p.w_row_stride, head_stride}, {kBoxK, kSlotRows, 1});
  }
  if (a.n_contiguous) launch_for_m<true>(a, pl, maps, heads, stream);
  else launch_for_m<false>(a, pl, maps, heads, stream);
}

}  // namespace

void set_bmm_tma_tuning(const BmmTmaTuning& t) { g_tuning = t; }

bool bmm_tma_eligible(const BmmTmaArgs& a) {
  BmmPlan pl;
  return plan_launch(a, current_device(), &pl);
}

int bmm_tma_ring_slots(const BmmTmaArgs& a) {
  BmmPlan pl;
  return plan_launch(a, current_device(), &pl) ? pl.slots : 0;
}

int bmm_tma_smem_bytes(const BmmTmaArgs& a) {
  BmmPlan pl;
  const int device = current_device();
  return plan_launch(a, device, &pl) ? launch_smem_bytes(a, pl, device) : 0;
}

bool try_launch_bmm_tma(const BmmTmaArgs& a, cudaStream_t stream) {
  BmmPlan pl;
  if (!plan_launch(a, current_device(), &pl)) return false;
  launch_planned(a, pl, stream);
  return true;
}

void launch_bmm_tma(const BmmTmaArgs& a, cudaStream_t stream) {
  LOCUS_CHECK(try_launch_bmm_tma(a, stream), "BMM TMA kernel: ineligible problem (M = ", a.m, ", N = ", a.n,
              ", K = ", a.k, "; needs an sm_90 GPU, 1 <= M <= ", kBmmTmaMaxM, ", K <= ", kBmmTmaMaxK,
              ", 16-byte aligned x, y and weights with strides of whole 16 bytes)");
}

}  // namespace locus::cuda::detail
