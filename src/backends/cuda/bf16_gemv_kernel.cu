// The BF16 matrix-vector kernel for decode (bf16_gemv.h). A CTA of 8 warps reduces R slots of
// RW weight rows (1, or 2 from 2 tokens on): the 8 / R warps of a slot split its K into
// contiguous parts, each lane takes every 32nd 16-byte vector of its warp's part of each row. A
// lane keeps two batches of vectors in flight (the next batch is loaded before the current one
// is multiplied), accumulates in fp32 and the sums are combined in a fixed order: lane partials
// by a shuffle tree, then the slot's warps in index order.
#include <string>

#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/bf16_gemv_device.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/grid_dependency.cuh"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/stream_registry.h"
#include "core/error.h"

namespace locus::cuda::detail {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;

EnvToggle g_enabled{"LOCUS_BF16_GEMV", true};
// Two rows a warp at M >= 2 (LOCUS_BF16_GEMV_ROW_PAIRS=0: one).
EnvToggle g_row_pairs{"LOCUS_BF16_GEMV_ROW_PAIRS", true};

// The two bf16 values of a 32-bit word as fp32 (exact).
__device__ __forceinline__ float low_of(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float high_of(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// acc[t] += the dot product of weight vector wv with token t's vector xv[t] (8 terms in K order).
template <int M>
__device__ __forceinline__ void fma_vector(const uint4& wv, const uint4 (&xv)[M], float (&acc)[M]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t wi = uint4_word(wv, i);
#pragma unroll
    for (int t = 0; t < M; ++t) {
      acc[t] = fmaf(low_of(wi), low_of(uint4_word(xv[t], i)), acc[t]);
      acc[t] = fmaf(high_of(wi), high_of(uint4_word(xv[t], i)), acc[t]);
    }
  }
}

// M tokens; R row slots per CTA, each of RW consecutive rows that one warp's loads share the
// activations of (RW = 2 halves the activation loads and conversions a weight byte costs at
// M >= 2). Batches of U vectors a row per lane: fewer where registers run short.
template <int M, int R, int RW>
__global__ void __launch_bounds__(kThreads) bf16_gemv_kernel(Bf16GemvArgs a) {
  constexpr int kWarpsPerSlot = kWarps / R;
  constexpr int U = M * RW <= 2 ? 4 : 2;
  constexpr int kStep = 32 * U;  // vectors a warp's batch covers
  __shared__ float partial[kWarps][RW][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * R + warp / kWarpsPerSlot) * RW;
  const int part = warp % kWarpsPerSlot;
  const int64_t vectors = a.k / 8;
  const int64_t v_end = vectors * (part + 1) / kWarpsPerSlot;
  int64_t v = vectors * part / kWarpsPerSlot + lane;
  bool has_row[RW];
  const uint4* w_row[RW];
#pragma unroll
  for (int j = 0; j < RW; ++j) {
    has_row[j] = row0 + j < a.n;
    w_row[j] = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.w) + (has_row[j] ? row0 + j : 0) * a.w_ld);
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // The first batch of weights before the wait: they do not depend on the kernel before.
  uint4 wv[RW][U];
#pragma unroll
  for (int j = 0; j < RW; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u)
      wv[j][u] = has_row[j] && v + 32 * u < v_end ? gemv_load_streamed(w_row[j] + v + 32 * u) : zero;
  launch_dependents();
  wait_for_previous_grid();

  float acc[RW][U][M];
#pragma unroll
  for (int j = 0; j < RW; ++j)
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < M; ++t) acc[j][u][t] = 0.f;
  for (; v < v_end; v += kStep) {
    uint4 xv[U][M];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < M; ++t) {
        const uint4* x_row = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + t * a.x_ld);
        xv[u][t] = v + 32 * u < v_end ? __ldg(x_row + v + 32 * u) : zero;
      }
    uint4 next[RW][U];
#pragma unroll
    for (int j = 0; j < RW; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t at = v + kStep + 32 * u;
        next[j][u] = has_row[j] && at < v_end ? gemv_load_streamed(w_row[j] + at) : zero;
      }
#pragma unroll
    for (int j = 0; j < RW; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) fma_vector<M>(wv[j][u], xv[u], acc[j][u]);
#pragma unroll
    for (int j = 0; j < RW; ++j)
#pragma unroll
      for (int u = 0; u < U; ++u) wv[j][u] = next[j][u];
  }

#pragma unroll
  for (int j = 0; j < RW; ++j)
#pragma unroll
    for (int t = 0; t < M; ++t) {
      float s = acc[j][0][t];
#pragma unroll
      for (int u = 1; u < U; ++u) s += acc[j][u][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
      if (lane == 0) partial[warp][j][t] = s;
    }
  __syncthreads();
  if (threadIdx.x >= R * RW * M) return;
  const int slot = threadIdx.x / (RW * M), j = (threadIdx.x / M) % RW, t = threadIdx.x % M;
  const int64_t out_row = (static_cast<int64_t>(blockIdx.x) * R + slot) * RW + j;
  if (out_row >= a.n) return;
  float s = partial[slot * kWarpsPerSlot][j][t];
#pragma unroll
  for (int p = 1; p < kWarpsPerSlot; ++p) s += partial[slot * kWarpsPerSlot + p][j][t];
  gemv_store_output(a, t, out_row, s);
}

template <int M, int RW>
void launch_for_m(const Bf16GemvArgs& a, int slots, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.n + slots * RW - 1) / (slots * RW)));
  DependentLaunch launch(grid, dim3(kThreads), 0, stream, small_op_overlap());
  cudaError_t err = cudaErrorInvalidValue;
  switch (slots) {
    case 1: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_kernel<M, 1, RW>, a); break;
    case 2: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_kernel<M, 2, RW>, a); break;
    case 4: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_kernel<M, 4, RW>, a); break;
    case 8: err = cudaLaunchKernelEx(&launch.config, bf16_gemv_kernel<M, 8, RW>, a); break;
  }
  LOCUS_CUDA_CHECK_NAMED(err, "bf16_gemv_kernel launch failed");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool bf16_gemv_eligible(const Bf16GemvArgs& a) {
  return a.m >= 1 && a.m <= kBf16GemvMaxM && a.n >= 1 && a.k >= 8 && a.k % 8 == 0 && a.w_ld % 8 == 0 &&
         (a.m == 1 || a.x_ld % 8 == 0) && aligned16(a.x) && aligned16(a.w) && a.n <= (int64_t{1} << 31) - 8;
}

int bf16_gemv_slots_per_cta(int64_t n, int64_t k, int sms) {
  // About 8 vectors a lane: K * R / 2048 of them with R slots of 8 / R warps each.
  int slots = 8;
  while (slots > 1 && k * slots > 16384) slots /= 2;
  // At least 4 CTAs an SM where the slots allow it (a small N splits its slots' K further).
  while (slots > 1 && (n + slots - 1) / slots < 4 * static_cast<int64_t>(sms)) slots /= 2;
  return slots;
}

bool bf16_gemv_enabled() { return g_enabled.on(); }

int bf16_gemv_rows_per_warp(int64_t m) { return m >= 2 && g_row_pairs.on() ? 2 : 1; }

void set_bf16_gemv_row_pairs(int on) { g_row_pairs.set_or_reset(on); }

std::string bf16_gemv_problem_key(const Bf16GemvArgs& a, cudaStream_t stream) {
  const int bias = a.bias == nullptr ? 0 : a.bias_f32 ? 2 : 1;
  return str("bf16_gemv:", a.m, 'x', a.n, 'x', a.k, ':', a.x_ld, ',', a.w_ld, ',', a.y_ld, ':', a.y_f32, bias,
             a.alpha != nullptr, ":sm", partition_stream_sm_count(stream));
}

void launch_bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream) {
  int device = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&device));
  const int sms = device_attribute(device, cudaDevAttrMultiProcessorCount);
  const int rw = bf16_gemv_rows_per_warp(a.m);
  const int slots = bf16_gemv_slots_per_cta((a.n + rw - 1) / rw, a.k, sms);
  switch (a.m * 2 + (rw == 2 ? 1 : 0)) {
    case 2: launch_for_m<1, 1>(a, slots, stream); break;
    case 4: launch_for_m<2, 1>(a, slots, stream); break;
    case 5: launch_for_m<2, 2>(a, slots, stream); break;
    case 6: launch_for_m<3, 1>(a, slots, stream); break;
    case 7: launch_for_m<3, 2>(a, slots, stream); break;
    case 8: launch_for_m<4, 1>(a, slots, stream); break;
    default: launch_for_m<4, 2>(a, slots, stream); break;
  }
}

}  // namespace locus::cuda::detail

namespace locus::cuda {

void set_bf16_gemv_enabled(bool on) { detail::g_enabled.set(on); }

}  // namespace locus::cuda
