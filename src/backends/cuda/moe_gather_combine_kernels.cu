// ops::moe_gather and ops::moe_combine on CUDA. Row and slot indices are device values: an index
// out of range is never dereferenced (gather: the output row is zero-filled; combine: the term
// is skipped, like slot -1).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/moe_kernels.h"

namespace locus::cuda::detail {
namespace {

constexpr int kThreads = 256;

// One block per output row (striding over rows); V is the widest unit that divides the row
// bytes, both row strides and both base addresses.
template <typename V>
__global__ void __launch_bounds__(kThreads) gather_kernel(MoeGatherArgs a, int64_t vecs_per_row) {
  const int64_t x_ld = a.x_ld * a.elem_bytes / static_cast<int64_t>(sizeof(V));
  const int64_t y_ld = a.y_ld * a.elem_bytes / static_cast<int64_t>(sizeof(V));
  const V* x = static_cast<const V*>(a.x);
  V* y = static_cast<V*>(a.y);
  for (int64_t i = blockIdx.x; i < a.n; i += gridDim.x) {
    const int64_t r = a.rows[i * a.rows_stride];
    const bool valid = r >= 0 && r < a.x_rows;
    for (int64_t v = threadIdx.x; v < vecs_per_row; v += kThreads) y[i * y_ld + v] = valid ? x[r * x_ld + v] : V{};
  }
}

template <typename V>
void launch_gather_as(const MoeGatherArgs& a, cudaStream_t stream) {
  const int64_t vecs = a.cols * a.elem_bytes / static_cast<int64_t>(sizeof(V));
  const int blocks = static_cast<int>(a.n < 65536 ? a.n : 65536);
  gather_kernel<V><<<blocks, kThreads, 0, stream>>>(a, vecs);
  LOCUS_CUDA_CHECK_LAUNCH("moe_gather kernel launch");
}

bool fits(const MoeGatherArgs& a, int64_t unit) {
  const auto addr = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
  return (a.cols * a.elem_bytes) % unit == 0 && (a.x_ld * a.elem_bytes) % unit == 0 &&
         (a.y_ld * a.elem_bytes) % unit == 0 && addr(a.x) % unit == 0 && addr(a.y) % unit == 0;
}

__device__ __forceinline__ float load_f(const void* p, int64_t idx, bool f32) {
  if (f32) return static_cast<const float*>(p)[idx];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[idx]);
}

// grid.x: tokens (striding), grid.y: column blocks of kThreads.
__global__ void __launch_bounds__(kThreads) combine_kernel(MoeCombineArgs a) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= a.hidden) return;
  for (int64_t t = blockIdx.x; t < a.tokens; t += gridDim.x) {
    float acc = a.shared ? load_f(a.shared, t * a.shared_ld + c, a.shared_f32) : 0.f;
    for (int j = 0; j < a.top_k; ++j) {
      const int64_t r = a.slot[t * a.slot_s0 + j * a.slot_s1];
      if (r < 0 || r >= a.eo_rows) continue;
      const float w = a.weights[t * a.w_s0 + j * a.w_s1];
      // Product rounded, then added (no fused multiply-add), as the CPU build computes it.
      acc = __fadd_rn(acc, __fmul_rn(w, load_f(a.expert_out, r * a.eo_ld + c, a.eo_f32)));
    }
    if (a.y_f32) static_cast<float*>(a.y)[t * a.y_ld + c] = acc;
    else static_cast<__nv_bfloat16*>(a.y)[t * a.y_ld + c] = __float2bfloat16_rn(acc);
  }
}

}  // namespace

void launch_moe_gather(const MoeGatherArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.cols == 0) return;
  if (fits(a, 16)) return launch_gather_as<uint4>(a, stream);
  if (fits(a, 4)) return launch_gather_as<uint32_t>(a, stream);
  if (fits(a, 2)) return launch_gather_as<uint16_t>(a, stream);
  launch_gather_as<uint8_t>(a, stream);
}

void launch_moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0 || a.hidden == 0) return;
  const int64_t col_blocks = (a.hidden + kThreads - 1) / kThreads;
  LOCUS_CHECK(col_blocks <= 65535, "moe_combine: hidden size ", a.hidden, " exceeds the kernel's ", 65535 * kThreads,
              " columns");
  const dim3 grid(static_cast<unsigned>(a.tokens < 65536 ? a.tokens : 65536), static_cast<unsigned>(col_blocks));
  combine_kernel<<<grid, kThreads, 0, stream>>>(a);
  LOCUS_CUDA_CHECK_LAUNCH("moe_combine kernel launch");
}

}  // namespace locus::cuda::detail
