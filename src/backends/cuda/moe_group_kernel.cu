// ops::moe_group on CUDA, deterministic (no atomics, so no scheduling shows in the output):
//  1. count: block e counts the pairs routed to expert e and writes offsets[e + 1];
//  2. scan: one block turns the counts into offsets in place (integer sums: exact in any order);
//  3. place: block e walks the pairs in (t, j) order in chunks of its threads; a warp ballot and
//     the per-warp totals before it give each match its rank, so expert e's rows are filled in
//     the CPU loop's order. Block 0 also marks pairs with ids outside [0, E) (slot = -1) and the
//     last block fills the rows past offsets[E] (left over by such pairs) with -1.
// Every block scans all T * k ids: E x (T * k) reads, cheap at decode sizes; a tiled histogram
// would scale better for long prefills.
#include "backends/cuda/cuda_moe_ops.h"
#include "backends/cuda/small_ops_launch.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

struct MoeGroupArgs {
  const int32_t* ids; int64_t ids_ld;  // [tokens, top_k]
  int64_t tokens; int top_k;
  int experts;
  int32_t* offsets;                    // [experts + 1], contiguous
  int32_t* rows;                       // [tokens * top_k], contiguous
  int32_t* slot; int64_t slot_ld;      // [tokens, top_k]
};

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int32_t id_at(const MoeGroupArgs& a, int64_t i) {
  return a.ids[(i / a.top_k) * a.ids_ld + i % a.top_k];
}

// Integer sum over the block (exact; small_ops_launch.cuh's block_sum is fp32); every thread gets
// it. `tmp` holds kWarps ints.
__device__ int block_sum_int(int v, int* tmp) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  if (threadIdx.x % 32 == 0) tmp[threadIdx.x / 32] = v;
  __syncthreads();
  int total = 0;
  for (int w = 0; w < kWarps; ++w) total += tmp[w];
  __syncthreads();  // tmp may be reused right after
  return total;
}

__global__ void __launch_bounds__(kThreads) count_kernel(MoeGroupArgs a) {
  __shared__ int tmp[kWarps];
  const int e = blockIdx.x;
  const int64_t R = a.tokens * a.top_k;
  int n = 0;
  for (int64_t i = threadIdx.x; i < R; i += kThreads) n += id_at(a, i) == e;
  n = block_sum_int(n, tmp);
  if (threadIdx.x == 0) a.offsets[e + 1] = n;
}

// offsets[1..E] hold counts; afterwards offsets[e] = sum of counts[0, e).
__global__ void __launch_bounds__(kThreads) scan_kernel(MoeGroupArgs a) {
  __shared__ int warp_total[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int carry = 0;
  for (int c0 = 1; c0 <= a.experts; c0 += kThreads) {
    const int idx = c0 + threadIdx.x;
    int v = idx <= a.experts ? a.offsets[idx] : 0;
    // Inclusive scan within the warp, then add the totals of the warps before.
    for (int off = 1; off < 32; off <<= 1) {
      const int o = __shfl_up_sync(kFull, v, off);
      if (lane >= off) v += o;
    }
    if (lane == 31) warp_total[warp] = v;
    __syncthreads();
    int before = carry, chunk = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += warp_total[w];
      chunk += warp_total[w];
    }
    if (idx <= a.experts) a.offsets[idx] = before + v;
    carry += chunk;
    __syncthreads();
  }
  if (threadIdx.x == 0) a.offsets[0] = 0;
}

__global__ void __launch_bounds__(kThreads) place_kernel(MoeGroupArgs a) {
  __shared__ int warp_count[kWarps];
  const int e = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t R = a.tokens * a.top_k;
  const int base = a.offsets[e], end = a.offsets[e + 1];
  int placed = 0;  // rows of expert e filled by earlier chunks
  for (int64_t c0 = 0; c0 < R; c0 += kThreads) {
    const int64_t i = c0 + threadIdx.x;
    const int32_t id = i < R ? id_at(a, i) : -1;
    const bool match = i < R && id == e;
    const unsigned ballot = __ballot_sync(kFull, match);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = placed, chunk = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += warp_count[w];
      chunk += warp_count[w];
    }
    if (match) {
      const int r = before + base + __popc(ballot & ((1u << lane) - 1u));
      if (r < end) {  // always true when the counts came from these ids; never write past them
        const int64_t t = i / a.top_k, j = i % a.top_k;
        a.rows[r] = static_cast<int32_t>(t);
        a.slot[t * a.slot_ld + j] = r;
      }
    }
    if (e == 0 && i < R && (id < 0 || id >= a.experts)) a.slot[(i / a.top_k) * a.slot_ld + i % a.top_k] = -1;
    placed += chunk;
    __syncthreads();  // warp_count is rewritten by the next chunk
  }
  if (e == a.experts - 1)
    for (int64_t r = end + threadIdx.x; r < R; r += kThreads) a.rows[r] = -1;
}

}  // namespace

void moe_group(const Tensor& ids, int64_t num_experts, const Tensor& offsets, const Tensor& rows, const Tensor& slot,
               void* stream) {
  if (!start_op("moe_group", ids, num_experts + 1)) return;  // offsets are written even without tokens
  MoeGroupArgs a{};
  a.ids = ids.data<int32_t>();
  a.ids_ld = ids.stride(0);
  a.tokens = ids.size(0);
  a.top_k = static_cast<int>(ids.size(1));
  a.experts = static_cast<int>(num_experts);
  a.offsets = offsets.data<int32_t>();
  a.rows = rows.data<int32_t>();
  a.slot = slot.data<int32_t>();
  a.slot_ld = slot.stride(0);
  const cudaStream_t s = as_stream(stream);
  // Grids of E blocks: every expert writes its offset, also when no token is routed to it.
  count_kernel<<<a.experts, kThreads, 0, s>>>(a);
  LOCUS_CUDA_CHECK_LAUNCH("moe_group count kernel launch");
  scan_kernel<<<1, kThreads, 0, s>>>(a);
  LOCUS_CUDA_CHECK_LAUNCH("moe_group scan kernel launch");
  place_kernel<<<a.experts, kThreads, 0, s>>>(a);
  LOCUS_CUDA_CHECK_LAUNCH("moe_group place kernel launch");
}

}  // namespace locus::cuda
