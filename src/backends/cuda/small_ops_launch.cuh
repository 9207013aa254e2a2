// Launch helpers shared by the small-op kernels: the stream handle, the current device, block
// and grid sizes, and warp / block sums with a fixed reduction order (deterministic results).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/grid_dependency.cuh"
#include "core/tensor.h"

namespace locus::cuda::detail {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Entry of every small op: `lead` (the operand that decides the device) must be on a CUDA
// device, which becomes current. False when there is nothing to do (`elements` == 0).
inline bool start_op(const char* op, const Tensor& lead, int64_t elements) {
  LOCUS_CHECK(lead.device().is_cuda(), op, ": tensors must be on a CUDA device, got ", lead.describe());
  if (elements == 0) return false;
  use_device(lead.device().index);
  return true;
}

// Threads per block for `items` work items per block: a multiple of 32 in [32, max_threads].
inline int block_threads(int64_t items, int max_threads) {
  const int64_t warps = (std::max<int64_t>(items, 1) + 31) / 32;
  return static_cast<int>(std::min<int64_t>(warps * 32, max_threads));
}

// Blocks for `units` independent units (kernels loop with a grid stride beyond the cap).
inline int grid_blocks(int64_t units, int64_t cap = int64_t{1} << 20) {
  return static_cast<int>(std::clamp<int64_t>(units, 1, cap));
}

// Launches a kernel whose first statement is small_op_start() (grid_dependency.cuh) as a
// programmatic dependent launch, so that its CTAs are scheduled while the kernel before it
// finishes (LOCUS_SMALL_OPS_PDL=0: plain stream order, small_op_overlap()).
template <typename... Params, typename... Args>
void launch_small_op(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                     const char* what, Args&&... args) {
  DependentLaunch launch(grid, block, smem_bytes, stream, small_op_overlap());
  LOCUS_CUDA_CHECK_NAMED(cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...), what);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the total. `scratch`
// holds 32 floats of shared memory, free again when this returns.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_sum(lane < warps ? scratch[lane] : 0.f);
  __syncthreads();
  return v;
}

}  // namespace locus::cuda::detail
