// Internal to the CUDA backend: the batched GEMM of MLA's absorbed products at decode sizes,
// y[h] = x[h] W[h]^T for h < H, with W[h] a BF16 [N, K] matrix per head (stored [N, K], K
// contiguous, or [K, N], N contiguous), M <= 64 tokens and K <= 512: a weight-streaming kernel
// fed by TMA (sm_90), and its locality-domain form as ONE launch.
//
// Why. Partitioned over heads as a fork/join of cuBLASLt calls on the green-context streams, the
// BMM pays about 2 us of context switching in a graph on top of two half-size calls, each with
// most of a whole call's fixed cost (docs/benchmarks.md): 11-13 us against 7 us unpartitioned for
// H = 128, N x K = 512 x 128. One domain-aware launch pays neither. Unpartitioned, cuBLASLt stays
// faster on the H200 (this kernel reaches 7.4-8.6 us at M <= 8), so cuda::bmm keeps cuBLASLt and
// the partitioned op takes the faster of the two forms, timed once (cuda_ops.h
// bmm_partitioned_fastest).
//
// How it runs. A unit of work is a block of up to `unit_rows` weight rows of one head (a multiple
// of 64), cut so that there are about as many units as resident CTAs or more. One CTA per SM; a
// producer warp takes its units:
//   - one domain: CTA b takes units b, b + grid, ... (no atomics);
//   - several, with rank tables: one CTA per SM of the domains, and the CTA on the SM of rank r in
//     domain d takes d's units r, r + (d's SMs), ... It starts copying its first unit at once and
//     meanwhile claims rank r for this launch with a compare-and-swap against a launch count
//     (a second CTA on the same SM, or a CTA on an SM outside the domains, claims a free rank
//     instead and its first copy is not written out). So correctness never depends on where CTAs
//     land, and no CTA waits for a counter before its first copy. No stealing: each domain's work
//     stays on its SMs;
//   - several, without rank tables: atomic counters, own domain first, then stealing (unit_queue.cuh).
// Per unit it copies the head's activations [M, K] into one of two x buffers and the unit's
// weights, 64 rows at a time, into a ring of an even number of slots: all by TMA tensor copies in
// 128-byte swizzled boxes of 64 K (elements outside the tensors arrive as zeros, so N, M and K need
// not be multiples of the boxes). Two consumer warpgroups take alternate slots, so that one slot's
// multiply and stores overlap the next one's (with one group the kernel took 1.15-1.4x as long on
// the H200).
// Warp w of a group multiplies rows 16 w..16 w + 15 of its slot over the whole K (A fragments by
// ldmatrix; mma.sync m16n8k16 with tokens on the n side, or for 17..64 tokens wgmma m64nNk16
// reading the tokens from shared memory; fp32 sums). Up to 16 tokens the warps store their
// outputs directly; with more, a slot's outputs go through one of its group's staging buffers and
// out by one TMA store (whole lines). Each output is one warp's sum over K in a fixed order, so
// the result does not depend on the units, the CTAs or the domains: partitioned and unpartitioned
// launches are bitwise equal. Launched as a programmatic dependent launch: a CTA copies the
// weights of its first units into the ring (as far as it takes them) while the previous kernel in
// the stream drains, and waits for that kernel only before the activations. So the weights must
// not be outputs of the kernel launched right before it (module weights never are; an in-place
// reload writes them by copies, which a dependent launch does not overlap).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cta_trace.h"

namespace locus::cuda::detail {

constexpr int kBmmTmaMaxM = 64;
constexpr int kBmmTmaMaxK = 512;
constexpr int kBmmTmaMaxParts = 8;
constexpr int kBmmTmaMaxDomains = 8;

// The weights of heads [head0, head0 + heads), one domain's shard (or all of them).
struct BmmTmaPart {
  const void* w = nullptr;    // bf16, the first of its heads
  int64_t w_head_stride = 0;  // elements between heads
  int64_t w_row_stride = 0;   // elements between stored rows (n rows, or k rows with n_contiguous)
  int32_t heads = 0;
  int32_t head0 = 0;          // its first head's index in x and y
  int32_t domain = 0;
};

struct BmmTmaArgs {
  bool n_contiguous = false;  // weights stored [K, N] per head (else [N, K])
  const uint16_t* x = nullptr;  // bf16 [H][M][K], K contiguous
  int64_t x_head_stride = 0, x_row_stride = 0;
  void* y = nullptr;            // bf16 or fp32 [H][M][N], N contiguous
  int64_t y_head_stride = 0, y_row_stride = 0;
  bool y_f32 = false;
  int32_t m = 0, n = 0, k = 0;
  int32_t num_parts = 0;
  BmmTmaPart parts[kBmmTmaMaxParts];
  // SM id -> domain (domain_table.h); nullptr: every SM belongs to domain 0.
  const uint8_t* sm_domain = nullptr;
  int32_t num_domains = 1;
  // SM id -> rank among its domain's SMs, and SMs per domain (domain_table.h). With them (and SMs
  // in every domain that has work) the units are dealt out by rank; without, by atomic counters.
  const uint8_t* sm_rank = nullptr;
  int32_t domain_sms[kBmmTmaMaxDomains] = {};
};

// True when the kernel takes the problem on the current device: sm_90 or newer with the driver's
// tensor-map entry point; 1 <= M <= 64, 1 <= K <= 512; 16-byte aligned x, y and weights with
// strides of whole 16 bytes; parts over 1..8 domains. A false answer launches nothing.
bool bmm_tma_eligible(const BmmTmaArgs& a);
// The weight slots in the ring the kernel would use for `a` (a whole number per consumer group);
// 0 when it is not eligible.
int bmm_tma_ring_slots(const BmmTmaArgs& a);
// The dynamic shared memory its launch asks for (more than half an SM's, so that two of its CTAs
// never share one; see launch_smem_bytes); 0 when it is not eligible.
int bmm_tma_smem_bytes(const BmmTmaArgs& a);
// Launches on `stream` (capturable) when the problem is eligible, checking it once; false, with
// nothing launched, when it is not.
bool try_launch_bmm_tma(const BmmTmaArgs& a, cudaStream_t stream);
// The same, but throws when the problem is not eligible.
void launch_bmm_tma(const BmmTmaArgs& a, cudaStream_t stream);

// Knobs for benchmarks (0: the built-in choice).
struct BmmTmaTuning {
  int splits = 0;  // units per head (the unit rows are the head's rows / splits, in 64s)
  int slots = 0;   // this many weight slots in the ring (>= 2; rounded down to even, fewer where memory is short)
  int dependent_launch = 1;  // 0: plain stream order instead of a programmatic dependent launch
  int l2_promotion = 256;    // the tensor maps' L2 fetch size in bytes: 0 (none), 128 or 256
  int ctas_per_sm = 1;       // one domain only: CTAs per SM (sharing its memory and the ring bytes)
  int early_copy = 2;        // before the previous kernel ends, copy the first units into the ring,
                             // whole, until this many slots are filled (at most the ring; the
                             // default: one per consumer group); 0: only ask L2 for the first unit
  int beside_next = -1;      // 1: size the ring for half an SM (still one CTA per SM: the launch
                             // asks for just over half the SM's memory all the same), so that the
                             // next launch's CTAs are resident beside these and copy early (as
                             // the streaming GEMM's TMA feed); where that leaves no room for
                             // two slots, the usual size. -1 (the default): 1 for launches over
                             // several domains, whose CTAs start spread out and gain most from
                             // starting early (H200, 2026-12-05: 8.3 -> 7.3 us at K = 128, M = 1),
                             // 0 for one domain (6.9 -> 7.2 us there)
  // A timeline of the launches (bench/cuda/bmm_timeline_bench.cpp; records of BmmTraceWord), or off.
  CtaTrace trace;
};
enum BmmTraceWord {
  kTraceStart = kCtaTraceStart,  // its first instruction
  kTraceGo,       // the producer knows its units: after the previous kernel (and the rank claim)
  kTraceFirst0,   // consumer group 0's first slot landed
  kTraceEnd0,     // group 0's outputs written
  kTraceFirst1,   // the same for group 1
  kTraceEnd1,
  kTraceWaited,   // the producer's wait for the previous kernel returned
  kBmmTraceWords
};
void set_bmm_tma_tuning(const BmmTmaTuning& t);

}  // namespace locus::cuda::detail
