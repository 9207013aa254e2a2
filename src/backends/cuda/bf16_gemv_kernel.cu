// The BF16 matrix-vector kernel for decode (bf16_gemv.h): a CTA of 8 warps computes one block of
// R slots of RW weight rows (bf16_gemv_device.cuh), its first weights loaded before it waits for
// the previous kernel in the stream.
#include <string>

#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/bf16_gemv_device.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/grid_dependency.cuh"
#include "backends/cuda/stream_registry.h"
#include "core/error.h"

namespace locus::cuda::detail {
namespace {

EnvToggle g_enabled{"LOCUS_BF16_GEMV", true};
// Two rows a warp at M >= 2 (LOCUS_BF16_GEMV_ROW_PAIRS=0: one).
EnvToggle g_row_pairs{"LOCUS_BF16_GEMV_ROW_PAIRS", true};

// M tokens; R row slots per CTA, each of RW consecutive rows that one warp's loads share the
// activations of (RW = 2 halves the activation loads and conversions a weight byte costs at
// M >= 2). Block blockIdx.x of the weight's rows.
template <int M, int R, int RW>
__global__ void __launch_bounds__(kGemvThreads) bf16_gemv_kernel(Bf16GemvArgs a) {
  __shared__ float partial[kGemvWarps][RW][M];
  const GemvRows rows{static_cast<const uint16_t*>(a.w), a.w_ld, a.n, 0};
  // The first batch of weights is loaded before the wait: they do not depend on the kernel before.
  gemv_block<M, R, RW>(a, rows, blockIdx.x, partial, [] {
    launch_dependents();
    wait_for_previous_grid();
  });
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
  const dim3 grid(static_cast<unsigned>((a.n + slots * rw - 1) / (slots * rw)));
  DependentLaunch launch(grid, dim3(kGemvThreads), 0, stream, small_op_overlap());
  cudaError_t err = cudaSuccess;
  dispatch_gemv_shape(a.m, rw, slots, [&]<int M, int R, int RW>() {
    err = cudaLaunchKernelEx(&launch.config, bf16_gemv_kernel<M, R, RW>, a);
  });
  LOCUS_CUDA_CHECK_NAMED(err, "bf16_gemv_kernel launch failed");
}

}  // namespace locus::cuda::detail

namespace locus::cuda {

void set_bf16_gemv_enabled(bool on) { detail::g_enabled.set(on); }

}  // namespace locus::cuda
