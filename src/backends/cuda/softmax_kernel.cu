// Row softmax on CUDA (cuda_small_ops.h): one block per row. One pass keeps a running maximum m
// and the sum s of exp(x - m) per thread (rescaled when m grows); the block merges them in a
// fixed order, then a second pass writes exp(x - m) / s. fp32 throughout, expf/division IEEE.
// As on the CPU: -inf entries give 0, an all -inf row gives NaN, and a NaN or +inf gives NaN.
#include <cmath>

#include "backends/cuda/cuda_small_ops.h"
#include "backends/cuda/float_pack.cuh"
#include "backends/cuda/small_ops_launch.cuh"
#include "backends/cuda/strided_offsets.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

constexpr int kVec = 4;  // fp32 elements per 16-byte access

struct SoftmaxArgs {
  const float* x;
  float* y;  // may be x itself: each element is read and then written by the same thread
  OffsetCalc<2> rows;
  int64_t num_rows, n;
};

// exp(from - to) for from <= to, with exp(-inf - anything) = 0 (from = -inf marks "nothing yet").
__device__ __forceinline__ float rescale(float from, float to) { return from == -INFINITY ? 0.f : expf(from - to); }

// Adds element v to a running (m, s). NaN never becomes m but makes s NaN; +inf makes s NaN.
__device__ __forceinline__ void add_element(float v, float& m, float& s) {
  if (v > m) {
    s = s * rescale(m, v) + rescale(v, v);
    m = v;
  } else {
    s += rescale(v, m);
  }
}

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  s = s * rescale(m, mx) + s2 * rescale(m2, mx);
  m = mx;
}

// Block-wide merge of (m, s); every thread gets the row's maximum and sum.
__device__ __forceinline__ void block_merge(float& m, float& s, float* sm, float* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  m = lane < warps ? sm[lane] : -INFINITY;
  s = lane < warps ? ss[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  __syncthreads();
}

template <int V>
__global__ void softmax_kernel(SoftmaxArgs a) {
  constexpr bool kVector = V > 1;
  __shared__ float sm[32], ss[32];
  for (int64_t row = blockIdx.x; row < a.num_rows; row += gridDim.x) {
    int64_t off[2];
    a.rows.offsets(row, off);
    const float* x = a.x + off[0];
    float* y = a.y + off[1];
    float m = -INFINITY, s = 0.f;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < a.n; c += static_cast<int64_t>(blockDim.x) * V) {
      float v[V];
      load_f32<Fp32, V, kVector>(x + c, v);
#pragma unroll
      for (int e = 0; e < V; ++e) add_element(v[e], m, s);
    }
    block_merge(m, s, sm, ss);
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < a.n; c += static_cast<int64_t>(blockDim.x) * V) {
      float v[V];
      load_f32<Fp32, V, kVector>(x + c, v);
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = expf(v[e] - m) / s;
      store_f32<Fp32, V, kVector>(y + c, v);
    }
  }
}

}  // namespace

void softmax(const Tensor& x, const Tensor& y, void* stream) {
  const char* op = "cuda::softmax";
  if (!start_op(op, x, x.numel())) return;
  SoftmaxArgs a{};
  a.x = x.data<float>();
  a.y = y.data<float>();
  a.n = x.dim() == 0 ? 1 : x.size(-1);
  a.num_rows = x.numel() / a.n;
  a.rows = make_offset_calc<2>(op, x.shape(), x.dim() - 1, {&x, &y});
  const bool vec = a.n % kVec == 0 && rows_aligned_16(x) && rows_aligned_16(y);
  const int threads = block_threads((a.n + (vec ? kVec : 1) - 1) / (vec ? kVec : 1), 1024);
  const cudaStream_t s = as_stream(stream);
  if (vec) softmax_kernel<kVec><<<grid_blocks(a.num_rows), threads, 0, s>>>(a);
  else softmax_kernel<1><<<grid_blocks(a.num_rows), threads, 0, s>>>(a);
  LOCUS_CUDA_CHECK_LAUNCH("softmax kernel launch");
}

}  // namespace locus::cuda
