// MLA's absorbed decode attention on CUDA cores (attention_kernels.h): one query token per
// sequence, every query head over one shared latent head (k_a = the latent, k_b = the rope key,
// v = the latent again).
//
// Why: at short contexts a decode step's attention is latency, not bandwidth. The tensor-core
// kernel packs 64 query rows in a CTA, so one sequence of 128 heads is 2 CTAs walking every key;
// here a CTA takes 4 heads (32 CTAs a sequence) and a key split (64 keys or more, up to one CTA
// per SM), and every step is short:
//   (1) scores: warp w takes keys w, w + 8, ...; lane l reads words l, l + 32, ... of the key
//       row (bf16 pairs) and multiplies them with its 4 heads' query words, kept in registers as
//       fp32; the 4 dot products are summed over the lanes in one spread reduction (6 shuffles,
//       a fixed order: deterministic), leaving each head's sum in 8 lanes;
//   (2) softmax: warp h takes head h's scores (log2 domain), its max, the probabilities and
//       their sum in fp32;
//   (3) values: thread t owns value words t, t + 256, ... and sums p * v over the split's keys
//       for the 4 heads (the value rows are the key rows already read, now from L1/L2).
// One split writes out = sum / l; several write unnormalized sums and (max, sum) in the
// tensor-core kernel's partial layout, merged by its combine kernel or, with counters, by the
// last CTA of each head group (no second launch).
#include <cuda_bf16.h>

#include "backends/cuda/attention_combine.cuh"
#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/attention_seq.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/small_ops_launch.cuh"

namespace locus::cuda::detail {
namespace {

constexpr int HB = kAttnDecodeHeads;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kWordsA = kAttnDecodeMaxDa / 2 / 32;  // k_a words a lane reads of a key row
constexpr int kWordsB = kAttnDecodeMaxDb / 2 / 32;  // k_b words
constexpr int kLanesPerHead = 32 / HB;              // lanes holding one head's score after (1)
constexpr int kKeysInFlight = 4;                    // key rows a warp loads before it reduces
constexpr int kValueUnroll = 8;                     // value rows a thread loads at once in (3)
static_assert(HB == 4, "the value step reads a key's probabilities as one float4");

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// v[0..N) summed over the warp's lanes; returns, in lane l, the sum of v[l / (32 / N)]. The
// first log2(N) exchange steps halve the values each lane carries, the rest add within groups
// of 32 / N lanes: 6 shuffles for N = 4 (20 for separate butterflies). Fixed order.
template <int N>
__device__ __forceinline__ float warp_sum_spread(float (&v)[N], int lane) {
  int n = N;
#pragma unroll
  for (int o = 16; o >= 32 / N; o /= 2, n /= 2) {
    const bool upper = (lane & o) != 0;  // keeps the upper half of its values
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      if (i < n / 2) {
        const float send = upper ? v[i] : v[i + n / 2];
        const float keep = upper ? v[i + n / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
      }
    }
  }
  float s = v[0];
#pragma unroll
  for (int o = 16 / N; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__device__ __forceinline__ const uint32_t* words(const void* base, int64_t element_offset) {
  return reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(base) + element_offset);
}

// The fused combine (AttnSplit::counters): after this CTA's partial sums are written, the last
// CTA of its (sequence, head group) to finish merges every split of the group's heads into `out`
// (the threadfence-reduction pattern: each CTA fences its writes before it counts itself in).
// The merge loads all the group's (max, sum) pairs at once, then each thread its outputs' terms
// of a split side by side: a few memory round trips, not one per head, output step and split.
// Its arithmetic is the combine kernel's (attention_combine.cuh), so the bits are the same.
// `weights` (HB x kAttnMaxSplits floats) and `pairs` are shared memory no longer needed.
constexpr int kMergeOutputs = HB * kAttnDecodeMaxDa / kThreads;  // outputs a thread writes
__device__ void merge_splits_if_last(const MlaAttentionArgs& a, const AttnSplit& sp, const AttnSeqOperands& so,
                                     int h0, float (*weights)[kAttnDecodeMaxSplitKeys],
                                     float2 (*pairs)[kAttnMaxSplits]) {
  static_assert(kAttnDecodeMaxSplitKeys >= kAttnMaxSplits, "a head's split weights live in its score row");
  __shared__ bool last;
  __shared__ float inv_l[HB];
  // One fence, by the thread that counts (as cooperative groups' grid sync does): the barrier
  // orders the CTA's writes before it, and a fence is cumulative over what its thread observed.
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* counter = sp.counters + blockIdx.z * gridDim.x + blockIdx.x;
    __threadfence();
    last = atomicAdd(counter, 1u) == static_cast<unsigned>(sp.splits - 1);
    if (last) {
      *counter = 0;      // the next launch on this stream starts from zero
      __threadfence();  // the other CTAs' partial sums before the merge's reads (after the barrier)
    }
  }
  __syncthreads();
  if (!last) return;
  const int64_t TH = a.T * a.H;
  const int64_t first = static_cast<int64_t>(blockIdx.z) * sp.splits * TH + h0;  // split 0, head h0
  const int heads = static_cast<int>(a.H - h0 < HB ? a.H - h0 : HB), splits = sp.splits;
  for (int i = threadIdx.x; i < heads * splits; i += kThreads) {  // split z of head h: (first + z TH + h)
    const float* ml = sp.partial_ml + (first + (i % splits) * TH + i / splits) * 2;
    pairs[i / splits][i % splits] = make_float2(__ldcg(ml), __ldcg(ml + 1));
  }
  __syncthreads();
  if (threadIdx.x < heads) {
    const float2* mine = pairs[threadIdx.x];
    inv_l[threadIdx.x] = attn_split_weights_of(
        splits, [&](int z) { return mine[z].x; }, [&](int z) { return mine[z].y; }, weights[threadIdx.x]);
  }
  __syncthreads();
  // Output e = h Dv + d of the group (token 0 of the sequence's rows); split z's partial sums of
  // the group's heads are one stretch from (first + z TH) Dv.
  const int outputs = heads * a.Dv;
  float sum[kMergeOutputs];
  int head[kMergeOutputs];
#pragma unroll
  for (int i = 0; i < kMergeOutputs; ++i) {
    sum[i] = 0.f;
    head[i] = (threadIdx.x + i * kThreads) / a.Dv;
  }
#pragma unroll 2
  for (int z = 0; z < splits; ++z) {
    const float* o = sp.partial_o + (first + z * TH) * a.Dv;
#pragma unroll
    for (int i = 0; i < kMergeOutputs; ++i) {
      const int e = threadIdx.x + i * kThreads;
      if (e < outputs) sum[i] = fmaf(weights[head[i]][z], __ldcg(o + e), sum[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kMergeOutputs; ++i) {
    const int e = threadIdx.x + i * kThreads;
    if (e < outputs)
      attn_store_output(so.out, a.out_f32, (h0 + head[i]) * a.out_head_stride + e - head[i] * a.Dv,
                        sum[i] * inv_l[head[i]]);
  }
}

// The query words of the CTA's 4 heads as fp32 pairs: q_stage[h][i][l] is word l + 32 i of
// head h0 + h's k_a part (i < kWordsA), then of its k_b part; zeros past the dims and for heads
// past H. Every thread issues its loads before it converts and stores any.
constexpr int kQWords = kWordsA + kWordsB;  // per lane and head
constexpr int kQPerThread = (HB * kQWords * 32 + kThreads - 1) / kThreads;
__device__ __forceinline__ void stage_queries(const MlaAttentionArgs& a, const AttnSeqOperands& so, int h0,
                                              float2 (*q_stage)[kQWords][32]) {
  const int wa = a.Da / 2, wb = a.Db / 2;
  uint32_t raw[kQPerThread];
#pragma unroll
  for (int u = 0; u < kQPerThread; ++u) {
    const int x = static_cast<int>(threadIdx.x) + u * kThreads;  // (h * kQWords + i) * 32 + l
    const int h = x / (kQWords * 32), i = x / 32 % kQWords, w = x % 32 + 32 * (i < kWordsA ? i : i - kWordsA);
    const bool valid = h < HB && h0 + h < a.H && (i < kWordsA ? w < wa : w < wb);
    const void* q = i < kWordsA ? so.q_a.ptr : so.q_b.ptr;
    const int64_t head_stride = i < kWordsA ? so.q_a.head_stride : so.q_b.head_stride;
    raw[u] = valid ? words(q, (h0 + h) * head_stride)[w] : 0u;
  }
#pragma unroll
  for (int u = 0; u < kQPerThread; ++u) {
    const int x = static_cast<int>(threadIdx.x) + u * kThreads;
    if (x < HB * kQWords * 32) (&q_stage[0][0][0])[x] = unpack_bf16x2(raw[u]);
  }
}

// The 4 heads' scores of one key whose words this lane holds (ka: k_a's words lane + 32 i, kb:
// k_b's), summed over the warp in a fixed order: lane l gets head l / kLanesPerHead's.
__device__ __forceinline__ float key_score(const float2 (&qa)[HB][kWordsA], const float2 (&qb)[HB][kWordsB],
                                           const uint32_t (&ka)[kWordsA], const uint32_t (&kb)[kWordsB], int lane) {
  float dot[HB];
#pragma unroll
  for (int h = 0; h < HB; ++h) dot[h] = 0.f;
#pragma unroll
  for (int i = 0; i < kWordsA; ++i) {
    const float2 k = unpack_bf16x2(ka[i]);
#pragma unroll
    for (int h = 0; h < HB; ++h) dot[h] = fmaf(qa[h][i].y, k.y, fmaf(qa[h][i].x, k.x, dot[h]));
  }
#pragma unroll
  for (int i = 0; i < kWordsB; ++i) {
    const float2 k = unpack_bf16x2(kb[i]);
#pragma unroll
    for (int h = 0; h < HB; ++h) dot[h] = fmaf(qb[h][i].y, k.y, fmaf(qb[h][i].x, k.x, dot[h]));
  }
  return warp_sum_spread<HB>(dot, lane);
}

__global__ void __launch_bounds__(kThreads, 2) attn_decode_kernel(const __grid_constant__ MlaAttentionArgs a, AttnSplit sp) {
  small_op_start();
  __shared__ float scores[HB][kAttnDecodeMaxSplitKeys];
  __shared__ __align__(16) float probs[kAttnDecodeMaxSplitKeys][HB];
  static_assert(sizeof(probs) >= sizeof(float2) * HB * kAttnMaxSplits, "the merge's (max, sum) pairs fit in probs");
  __shared__ float row_max[HB], row_sum[HB];
  __shared__ float2 q_stage[HB][kQWords][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const AttnSeqOperands so = seq_operands(a, static_cast<int>(blockIdx.z));
  const int h0 = static_cast<int>(blockIdx.x) * HB;
  const int64_t keys = so.q_start + 1;  // the query is the sequence's last key
  // The plan's splits cover the launch's key bound (a decode graph's, or the longest sequence's);
  // this sequence's own keys are spread evenly over them (at most split_keys each, as the bound is
  // at least the keys), so a sequence shorter than the bound still keeps every split busy.
  const int64_t per_split = (keys + sp.splits - 1) / sp.splits;
  const int64_t key_lo = static_cast<int64_t>(blockIdx.y) * per_split;
  const int n = static_cast<int>(keys - key_lo < 0 ? 0 : keys - key_lo < per_split ? keys - key_lo : per_split);
  const int wa = a.Da / 2, wb = a.Db / 2, wv = a.Dv / 2;
  const float scale_log2 = a.scale * kAttnLog2e;

  // (1) scores. The 4 heads' query words this lane multiplies, fp32 (zeros past the dims and
  // for heads past H). The CTA loads them together into shared memory first: loaded straight
  // into each lane's registers, the compiler issued the 36 loads one after another (one memory
  // round trip each, two thirds of the kernel's time in Nsight Compute).
  stage_queries(a, so, h0, q_stage);
  __syncthreads();
  float2 qa[HB][kWordsA], qb[HB][kWordsB];
#pragma unroll
  for (int h = 0; h < HB; ++h) {
#pragma unroll
    for (int i = 0; i < kWordsA; ++i) qa[h][i] = q_stage[h][i][lane];
#pragma unroll
    for (int i = 0; i < kWordsB; ++i) qb[h][i] = q_stage[h][kWordsA + i][lane];
  }
  for (int j0 = warp; j0 < n; j0 += kWarps * kKeysInFlight) {
    uint32_t ka[kKeysInFlight][kWordsA], kb[kKeysInFlight][kWordsB];
#pragma unroll
    for (int u = 0; u < kKeysInFlight; ++u) {
      const int j = j0 + u * kWarps;
      const int64_t key = key_lo + (j < n ? j : 0);
      const uint32_t* ra = words(so.k_a.ptr, key * so.k_a.row_stride);
      const uint32_t* rb = words(so.k_b.ptr, key * so.k_b.row_stride);
#pragma unroll
      for (int i = 0; i < kWordsA; ++i) ka[u][i] = j < n && lane + 32 * i < wa ? ra[lane + 32 * i] : 0u;
#pragma unroll
      for (int i = 0; i < kWordsB; ++i) kb[u][i] = j < n && lane + 32 * i < wb ? rb[lane + 32 * i] : 0u;
    }
#pragma unroll
    for (int u = 0; u < kKeysInFlight; ++u) {
      const int j = j0 + u * kWarps;
      if (j >= n) break;  // the same for the whole warp
      const float s = key_score(qa, qb, ka[u], kb[u], lane);
      if (lane % kLanesPerHead == 0) scores[lane / kLanesPerHead][j] = s * scale_log2;
    }
  }
  __syncthreads();

  // (2) softmax of each head's scores in this split.
  if (warp < HB) {
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, scores[warp][j]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int j = lane; j < n; j += 32) {
      const float p = exp2f(scores[warp][j] - m);
      probs[j][warp] = p;
      l += p;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) {
      row_max[warp] = m;
      row_sum[warp] = l;
    }
  }
  __syncthreads();

  // (3) values: sum over the split's keys of p * v, per value word, for the 4 heads.
  const int64_t TH = a.T * a.H;
  const int64_t split_index = static_cast<int64_t>(blockIdx.z) * sp.splits + blockIdx.y;
  for (int w = threadIdx.x; w < wv; w += kThreads) {
    float2 acc[HB];
#pragma unroll
    for (int h = 0; h < HB; ++h) acc[h] = make_float2(0.f, 0.f);
    const uint32_t* col = words(so.v.ptr, key_lo * so.v.row_stride) + w;
    const int64_t v_row_words = so.v.row_stride / 2;
    int j = 0;
    for (; j + kValueUnroll <= n; j += kValueUnroll) {
      uint32_t vw[kValueUnroll];
#pragma unroll
      for (int u = 0; u < kValueUnroll; ++u) vw[u] = col[(j + u) * v_row_words];
#pragma unroll
      for (int u = 0; u < kValueUnroll; ++u) {
        const float2 v = unpack_bf16x2(vw[u]);
        const float4 p = *reinterpret_cast<const float4*>(probs[j + u]);
        const float ps[HB] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int h = 0; h < HB; ++h) acc[h] = make_float2(fmaf(ps[h], v.x, acc[h].x), fmaf(ps[h], v.y, acc[h].y));
      }
    }
    for (; j < n; ++j) {
      const float2 v = unpack_bf16x2(col[j * v_row_words]);
      const float4 p = *reinterpret_cast<const float4*>(probs[j]);
      const float ps[HB] = {p.x, p.y, p.z, p.w};
#pragma unroll
      for (int h = 0; h < HB; ++h) acc[h] = make_float2(fmaf(ps[h], v.x, acc[h].x), fmaf(ps[h], v.y, acc[h].y));
    }
#pragma unroll
    for (int h = 0; h < HB; ++h) {
      const int head = h0 + h;
      if (head >= a.H) break;
      if (sp.splits == 1) {
        const float inv = 1.f / row_sum[h];
        const int64_t off = head * a.out_head_stride + 2 * w;  // token 0 of the sequence's rows
        if (a.out_f32) {
          *reinterpret_cast<float2*>(static_cast<float*>(so.out) + off) = make_float2(acc[h].x * inv, acc[h].y * inv);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(so.out) + off) =
              __floats2bfloat162_rn(acc[h].x * inv, acc[h].y * inv);
        }
      } else {
        *reinterpret_cast<float2*>(sp.partial_o + (split_index * TH + head) * a.Dv + 2 * w) = acc[h];
      }
    }
  }
  if (sp.splits > 1 && threadIdx.x < HB && h0 + static_cast<int>(threadIdx.x) < a.H) {
    float* ml = sp.partial_ml + (split_index * TH + h0 + threadIdx.x) * 2;
    ml[0] = row_max[threadIdx.x];  // -inf with l = 0 where the split holds none of the keys
    ml[1] = row_sum[threadIdx.x];
  }
  if (sp.splits > 1 && sp.counters != nullptr)
    merge_splits_if_last(a, sp, so, h0, scores, reinterpret_cast<float2(*)[kAttnMaxSplits]>(&probs[0][0]));
}

bool whole_words(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool attn_decode_applies(const MlaAttentionArgs& a) {
  if (a.T != 1 || a.per_head_groups || a.H > 0x7fffffff) return false;
  if (a.Da % 2 || a.Db % 2 || a.Dv % 2 || a.Da > kAttnDecodeMaxDa || a.Db > kAttnDecodeMaxDb ||
      a.Dv > kAttnDecodeMaxDa)
    return false;
  const bool table_or_batch = a.num_seqs > 0;
  for (const AttnOperand* o : {&a.q_a, &a.q_b, &a.k_a, &a.k_b, &a.v}) {
    if (o->f32 || o->row_stride % 2 || o->head_stride % 2) return false;
    // A table's or a batch's key pointers stand in for k_a, k_b and v (checked below).
    const bool key_operand = o == &a.k_a || o == &a.k_b || o == &a.v;
    if (!(key_operand && table_or_batch) && !whole_words(o->ptr, 4)) return false;
  }
  if (a.out_row_stride % 2 || a.out_head_stride % 2 || !whole_words(a.out, a.out_f32 ? 8 : 4)) return false;
  if (table_or_batch) {
    if (a.k_b_delta % 2 || a.v_delta % 2) return false;
    // A table's rows are cache blocks (whole allocations); a batch's are checked here.
    if (a.table_rows == nullptr)
      for (int i = 0; i < a.num_seqs; ++i)
        if (!whole_words(a.seq_k_a[i], 4)) return false;
  }
  return true;
}

void launch_attn_decode(const MlaAttentionArgs& a, const AttnSplit& split, cudaStream_t stream) {
  const int64_t groups = (a.H + HB - 1) / HB;
  LOCUS_CHECK(split.splits >= 1 && split.splits <= kAttnMaxSplits && split.split_keys >= 1 &&
                  split.split_keys <= kAttnDecodeMaxSplitKeys,
              "MLA decode attention: ", split.splits, " key splits of ", split.split_keys,
              " keys do not fit the kernel");
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(split.splits),
                  static_cast<unsigned>(a.num_seqs > 0 ? a.num_seqs : 1));
  launch_small_op(attn_decode_kernel, grid, kThreads, 0, stream, "MLA decode attention kernel launch", a, split);
}

}  // namespace locus::cuda::detail
