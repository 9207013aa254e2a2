// Internal to the CUDA backend: the launch configuration of the weight kernels, which may start
// while the previous kernel in the stream drains (programmatic dependent launch; the kernels wait
// for it with griddepcontrol.wait before reading its outputs, unit_queue.cuh).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace locus::cuda::detail {

// Pass `config` to cudaLaunchKernelEx. Not copyable: the configuration points at its attribute.
struct DependentLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  // `overlap`: may start during the previous kernel's tail; else plain stream order.
  DependentLaunch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, bool overlap) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = overlap ? 1 : 0;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  DependentLaunch(const DependentLaunch&) = delete;
  DependentLaunch& operator=(const DependentLaunch&) = delete;
};

// Whether the small ops (launch_small_op) launch as programmatic dependents: on unless
// LOCUS_SMALL_OPS_PDL=0 (read once).
bool small_op_overlap();

}  // namespace locus::cuda::detail
