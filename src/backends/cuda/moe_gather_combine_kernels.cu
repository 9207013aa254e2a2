// ops::moe_gather and ops::moe_combine on CUDA. Row and slot indices are device values: an index
// out of range is never dereferenced (gather: the output row is zero-filled; combine: the term
// is skipped, like slot -1).
#include <cuda_bf16.h>

#include "backends/cuda/cuda_moe_ops.h"
#include "backends/cuda/small_ops_launch.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;

struct MoeGatherArgs {
  const void* x; int64_t x_ld; int64_t x_rows;  // [x_rows, cols]
  const int32_t* rows; int64_t rows_stride;     // [n]
  void* y; int64_t y_ld;                        // [n, cols]
  int64_t n, cols;
  int elem_bytes;
};

struct MoeCombineArgs {
  const void* expert_out; int64_t eo_ld; int64_t eo_rows; bool eo_f32;
  const int32_t* slot; int64_t slot_s0, slot_s1;
  const float* weights; int64_t w_s0, w_s1;
  const void* shared; int64_t shared_ld; bool shared_f32;  // shared == nullptr: none
  void* y; int64_t y_ld; bool y_f32;
  int64_t tokens, hidden; int top_k;
};

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
  gather_kernel<V><<<grid_blocks(a.n, 65536), kThreads, 0, stream>>>(a, vecs);
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
  small_op_start();
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

void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, void* stream) {
  if (!start_op("moe_gather", x, y.numel())) return;
  MoeGatherArgs a{};
  a.x = x.data_ptr();
  a.x_ld = x.stride(0);
  a.x_rows = x.size(0);
  a.rows = rows.data<int32_t>();
  a.rows_stride = rows.stride(0);
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.n = y.size(0);
  a.cols = y.size(1);
  a.elem_bytes = static_cast<int>(dtype_size(x.dtype()));
  const cudaStream_t s = as_stream(stream);
  if (fits(a, 16)) return launch_gather_as<uint4>(a, s);
  if (fits(a, 4)) return launch_gather_as<uint32_t>(a, s);
  if (fits(a, 2)) return launch_gather_as<uint16_t>(a, s);
  launch_gather_as<uint8_t>(a, s);
}

void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, void* stream) {
  const char* op = "moe_combine";
  if (!start_op(op, y, y.numel())) return;
  const int64_t col_blocks = (y.size(1) + kThreads - 1) / kThreads;
  LOCUS_CHECK(col_blocks <= 65535, op, ": hidden size ", y.size(1), " exceeds the kernel's ", 65535 * kThreads,
              " columns");
  MoeCombineArgs a{};
  a.expert_out = expert_out.data_ptr();
  a.eo_ld = expert_out.stride(0);
  a.eo_rows = expert_out.size(0);
  a.eo_f32 = expert_out.dtype() == DType::kFP32;
  a.slot = slot.data<int32_t>();
  a.slot_s0 = slot.stride(0);
  a.slot_s1 = slot.stride(1);
  a.weights = weights.data<float>();
  a.w_s0 = weights.stride(0);
  a.w_s1 = weights.stride(1);
  a.shared = shared.defined() ? shared.data_ptr() : nullptr;
  a.shared_ld = shared.defined() ? shared.stride(0) : 0;
  a.shared_f32 = shared.defined() && shared.dtype() == DType::kFP32;
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.y_f32 = y.dtype() == DType::kFP32;
  a.tokens = y.size(0);
  a.hidden = y.size(1);
  a.top_k = static_cast<int>(slot.size(1));
  const dim3 grid(static_cast<unsigned>(grid_blocks(a.tokens, 65536)), static_cast<unsigned>(col_blocks));
  launch_small_op(combine_kernel, grid, kThreads, 0, as_stream(stream), "moe_combine kernel launch", a);
}

}  // namespace locus::cuda
