// Row top-k on CUDA (cuda_small_ops.h), one block per row. Every element gets a 64-bit order
// key, unique within the row: the value's order bits above (NaN lowest, -0 equal to +0) and the
// inverted column below, so "larger key" is exactly "larger value, then lower index".
// 1. Radix select, 8 bits per pass from the top, finds the k-th largest key T (stopping early
//    as soon as the chosen bucket holds exactly the elements still needed).
// 2. The k elements with key >= T are gathered: into shared memory when k <= kSharedSortMax,
//    otherwise as column numbers into the indices output itself (no workspace).
// 3. A bitonic network sorts them by key, descending; values are read back from x.
// Costs: a few passes over the row (L2-resident) for any k; the sort is cheap for small k and
// only correct (not fast) for very large k.
#include <algorithm>

#include "backends/cuda/cuda_small_ops.h"
#include "backends/cuda/float_pack.cuh"
#include "backends/cuda/small_ops_launch.cuh"
#include "backends/cuda/strided_offsets.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

constexpr int64_t kSharedSortMax = 4096;  // 32 KB of keys
constexpr unsigned kFullMask = 0xffffffffu;

struct TopkArgs {
  const void* x;
  void* values;
  void* indices;
  OffsetCalc<3> rows;  // x, values, indices
  int64_t num_rows, n, k;
  int64_t values_stride, indices_stride;  // along the last dimension
  bool values_f32;
};

// Order bits of a value: larger number -> larger key; NaN -> 0, below -inf; -0 -> +0.
__device__ __forceinline__ uint32_t value_key(float v) {
  if (v != v) return 0u;
  const uint32_t b = v == 0.f ? 0u : __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ uint64_t order_key(float v, int64_t col) {
  return (static_cast<uint64_t>(value_key(v)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(col));
}
__device__ __forceinline__ int64_t column_of(uint64_t key) { return 0xFFFFFFFFu - static_cast<uint32_t>(key); }

// Calls fn(valid, key) for every element of the row, V consecutive elements per thread and step.
// Every lane of every warp makes the same number of calls (valid = false past the end), so fn
// may use warp collectives.
template <class XT, int V, class Fn>
__device__ __forceinline__ void for_each_key(const typename XT::Storage* x, int64_t n, Fn&& fn) {
  const int64_t packs = n / V;  // the host picks V > 1 only when V divides n
  for (int64_t p0 = 0; p0 < packs; p0 += blockDim.x) {
    const int64_t p = p0 + threadIdx.x;
    const bool valid = p < packs;
    float v[V];
    if (valid) load_f32<XT, V, (V > 1)>(x + p * V, v);
#pragma unroll
    for (int e = 0; e < V; ++e) fn(valid, valid ? order_key(v[e], p * V + e) : uint64_t{0});
  }
}

struct SelectState {
  uint64_t prefix, mask;  // key bits fixed so far
  unsigned need;          // elements still to take among those matching prefix
  unsigned count;         // gathered so far
  int done;
};

// Warp 0: picks the digit (bits at `shift`) of the need-th largest matching key from the
// histogram; lane l holds bins 255 - 8l ... 248 - 8l, so lower lanes hold larger digits.
__device__ void choose_digit(const unsigned* hist, int shift, SelectState& st) {
  const int lane = threadIdx.x;
  const unsigned need = st.need;
  unsigned cnt[8], sum = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    cnt[e] = hist[255 - (lane * 8 + e)];
    sum += cnt[e];
  }
  unsigned incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned t = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += t;
  }
  __syncwarp();  // every lane has read st.need before one lane rewrites it
  unsigned above = incl - sum;
  if (above < need && need <= incl) {  // exactly one lane holds the need-th largest
    for (int e = 0; e < 8; ++e) {
      if (above + cnt[e] >= need) {
        st.need = need - above;
        st.prefix |= static_cast<uint64_t>(255 - (lane * 8 + e)) << shift;
        st.mask |= uint64_t{0xFF} << shift;
        st.done = cnt[e] == need - above;  // the whole bucket is taken: no need to look further
        break;
      }
      above += cnt[e];
    }
  }
}

// Orders positions i < l of a sequence so that the larger key sits at i.
struct SharedKeys {
  uint64_t* keys;
  __device__ uint64_t get(int64_t i) const { return keys[i]; }
  __device__ void set(int64_t i, uint64_t key) const { keys[i] = key; }
};
template <class XT, class Id>
struct GlobalColumns {  // the keys of the columns held in the indices output
  const typename XT::Storage* x;
  Id* cols;
  int64_t stride, n;
  __device__ uint64_t get(int64_t i) const {
    const int64_t c = min(max(static_cast<int64_t>(cols[i * stride]), int64_t{0}), n - 1);
    return order_key(XT::load(x[c]), c);
  }
  __device__ void set(int64_t i, uint64_t key) const { cols[i * stride] = static_cast<Id>(column_of(key)); }
};

// Sorts seq[0, n) descending with the bitonic network whose first step per stage mirrors the
// block (i <-> end - i) and whose later steps are half-cleaners. Every comparator moves the
// larger key to the lower position, so virtual padding past n (smallest keys) never moves and
// comparators that reach past n are simply skipped.
template <class Seq>
__device__ void bitonic_sort_desc(const Seq& seq, int64_t n) {
  int64_t p2 = 1;
  while (p2 < n) p2 <<= 1;
  auto order = [&](int64_t i, int64_t l) {
    if (l >= n) return;
    const uint64_t a = seq.get(i), b = seq.get(l);
    if (a < b) {
      seq.set(i, b);
      seq.set(l, a);
    }
  };
  for (int64_t size = 2; size <= p2; size <<= 1) {
    const int64_t half = size / 2;
    for (int64_t t = threadIdx.x; t < p2 / 2; t += blockDim.x) {
      const int64_t base = (t / half) * size, o = t % half;
      order(base + o, base + size - 1 - o);
    }
    __syncthreads();
    for (int64_t d = size / 4; d >= 1; d >>= 1) {
      for (int64_t t = threadIdx.x; t < p2 / 2; t += blockDim.x) {
        const int64_t i = (t / d) * 2 * d + t % d;
        order(i, i + d);
      }
      __syncthreads();
    }
  }
}

template <class XT, class Id, int V>
__global__ void topk_kernel(TopkArgs a) {
  small_op_start();
  extern __shared__ uint64_t shared_keys[];  // k keys when k <= kSharedSortMax
  __shared__ unsigned hist[256];
  __shared__ SelectState st;
  using XS = typename XT::Storage;
  const bool in_shared = a.k <= kSharedSortMax;
  const int lane = threadIdx.x & 31;
  for (int64_t row = blockIdx.x; row < a.num_rows; row += gridDim.x) {
    int64_t off[3];
    a.rows.offsets(row, off);
    const XS* x = static_cast<const XS*>(a.x) + off[0];
    Id* cols = static_cast<Id*>(a.indices) + off[2];
    if (threadIdx.x == 0) st = SelectState{0, 0, static_cast<unsigned>(a.k), 0, 0};

    // 1. radix select of the k-th largest key
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint64_t prefix = st.prefix, mask = st.mask;
      for_each_key<XT, V>(x, a.n, [&](bool valid, uint64_t key) {
        const unsigned digit = valid && (key & mask) == prefix ? static_cast<unsigned>(key >> shift) & 0xFFu : 256u;
        const unsigned peers = __match_any_sync(kFullMask, digit);  // one shared atomic per distinct digit
        if (digit < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
      });
      __syncthreads();
      if (threadIdx.x < 32) choose_digit(hist, shift, st);
      __syncthreads();
      if (st.done) break;
    }
    const uint64_t threshold = st.prefix;  // exactly k keys are >= threshold

    // 2. gather the k largest
    for_each_key<XT, V>(x, a.n, [&](bool valid, uint64_t key) {
      const bool take = valid && key >= threshold;
      const unsigned ballot = __ballot_sync(kFullMask, take);
      unsigned base = 0;
      if (lane == 0 && ballot) base = atomicAdd(&st.count, __popc(ballot));
      const unsigned slot = __shfl_sync(kFullMask, base, 0) + __popc(ballot & ((1u << lane) - 1u));
      if (take && slot < a.k) {
        if (in_shared) shared_keys[slot] = key;
        else cols[slot * a.indices_stride] = static_cast<Id>(column_of(key));
      }
    });
    __syncthreads();

    // 3. sort descending, then write columns and values
    if (in_shared) bitonic_sort_desc(SharedKeys{shared_keys}, a.k);
    else bitonic_sort_desc(GlobalColumns<XT, Id>{x, cols, a.indices_stride, a.n}, a.k);
    for (int64_t j = threadIdx.x; j < a.k; j += blockDim.x) {
      int64_t c;
      if (in_shared) {
        c = column_of(shared_keys[j]);
        cols[j * a.indices_stride] = static_cast<Id>(c);
      } else {
        c = static_cast<int64_t>(cols[j * a.indices_stride]);
      }
      c = min(max(c, int64_t{0}), a.n - 1);  // never read outside the row
      const float v = XT::load(x[c]);
      if (a.values_f32) static_cast<float*>(a.values)[off[1] + j * a.values_stride] = v;
      else static_cast<uint16_t*>(a.values)[off[1] + j * a.values_stride] = Bf16::store(v);
    }
    __syncthreads();  // shared state is reused by the next row
  }
}

}  // namespace

void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices, void* stream) {
  const char* op = "cuda::topk";
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  LOCUS_CHECK(n <= INT32_MAX, op, ": rows of ", n, " values are longer than the kernel's 2^31 - 1");
  if (!start_op(op, x, k == 0 ? 0 : x.numel())) return;
  TopkArgs a{};
  a.x = x.data_ptr();
  a.values = values.data_ptr();
  a.indices = indices.data_ptr();
  a.n = n;
  a.k = k;
  a.num_rows = x.numel() / n;
  a.rows = make_offset_calc<3>(op, x.shape(), x.dim() - 1, {&x, &values, &indices});
  a.values_stride = values.dim() == 0 ? 0 : values.stride(-1);
  a.indices_stride = indices.dim() == 0 ? 0 : indices.stride(-1);
  a.values_f32 = values.dtype() == DType::kFP32;
  const bool in_shared = k <= kSharedSortMax;
  const size_t shared_bytes = in_shared ? static_cast<size_t>(k) * sizeof(uint64_t) : 0;
  const cudaStream_t s = as_stream(stream);
  visit_bf16_fp32(x.dtype(), op, [&](auto xt) {
    using XT = decltype(xt);
    constexpr int kVec = static_cast<int>(16 / sizeof(typename XT::Storage));
    const bool vec = n % kVec == 0 && rows_aligned_16(x);
    // Enough threads for the row (large sorts in global memory get a full block).
    const int threads = in_shared ? block_threads((n + (vec ? kVec : 1) - 1) / (vec ? kVec : 1), 1024) : 1024;
    auto launch = [&](auto id_tag) {
      using Id = decltype(id_tag);
      auto* kernel = vec ? topk_kernel<XT, Id, kVec> : topk_kernel<XT, Id, 1>;
      launch_small_op(kernel, grid_blocks(a.num_rows), threads, shared_bytes, s, "topk kernel launch", a);
    };
    if (indices.dtype() == DType::kI32) launch(int32_t{});
    else launch(int64_t{});
  });
  LOCUS_CUDA_CHECK_LAUNCH("topk kernel launch");
}

}  // namespace locus::cuda
