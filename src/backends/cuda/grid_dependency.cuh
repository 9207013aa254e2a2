// Internal to the CUDA backend (device code): programmatic dependent launch (sm_90), which lets a
// kernel's CTAs be scheduled while the kernel before it in the stream still runs.
#pragma once

namespace locus::cuda::detail {

// Let the next kernel in the stream start launching (its CTAs become resident as ours leave), and
// wait until the previous one has finished and its writes are visible (immediate when it has, or
// when the launch was not programmatic).
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The first statement of every kernel launched by launch_small_op (small_ops_launch.cuh): the
// next kernel may be scheduled at once, and nothing here reads or writes memory before the
// kernels before it are done. So a chain of small kernels pays one launch latency, not one each.
__device__ __forceinline__ void small_op_start() {
  launch_dependents();
  wait_for_previous_grid();
}

}  // namespace locus::cuda::detail
