// Internal to the CUDA backend: the host side that the streaming GEMM's two feeds share
// (stream_gemm.h). launch_stream_gemm (stream_gemm_launch.cpp) plans the launch's rows of work,
// then hands it to the TMA-fed kernel where the tuning asks for it and the problem suits it
// (stream_gemm_tma_kernel.cu), else to the kernel fed by per-warp cp.async rings
// (stream_gemm_kernel.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/stream_gemm.h"
#include "backends/cuda/stream_gemm_rules.h"

namespace locus::cuda::detail {

// Both weight formats stream row groups of 4 16-row tiles in chunks of 64 K.
constexpr int kStreamGroupTiles = 4;
constexpr int kStreamChunkK = 64;

// The deepest rings of each feed's warps (StreamGemmTuning::stages). Deeper cp.async rings were
// slower on the H200 (docs/benchmarks.md, tenth session).
constexpr int kStreamRingMaxStages = 4;
constexpr int kStreamTmaMaxStages = 6;

// What a CTA asks L2 for before the previous kernel ends, by default (StreamGemmTuning::prefetch_kb).
constexpr int kPrefetchBytes = 64 << 10;

// A launch's rows of work: per domain, its parts' row groups (and halves, h = 2 with SwiGLU) end
// to end, C chunks of 64 K each. Fills each part's tiles, groups, row_begin, group_base and
// slot_row_base; *groups_total and *rows_total count every part's row groups and rows.
StreamRows plan_stream_rows(StreamGemmArgs& a, int h, int64_t* groups_total, int64_t* rows_total);

// Resident CTAs per SM of `kernel` (`threads` per CTA) at `smem_bytes` of dynamic shared memory on
// the current device, cached per device, kernel and size; 0 when one CTA does not fit. Raises the
// kernel's dynamic shared-memory limit to `smem_bytes` where it fits, for `traced` (its traced
// form, which runs under the same shape) as well.
int resident_ctas_per_sm(const void* kernel, const void* traced, int threads, int smem_bytes);
// Shared memory of one SM of the current device.
int shared_memory_per_sm();

// The two feeds, for a launch planned by plan_stream_rows on `sms` SMs under tuning `t`.
void launch_stream_gemm_rings(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total,
                              int sms, const StreamGemmTuning& t, cudaStream_t stream);
// False, launching nothing, where the TMA feed does not take the problem (it takes NVFP4 at
// M <= 16 whose parts' activations are a.x, on a device with TMA).
bool launch_stream_gemm_tma(StreamGemmArgs& a, const StreamRows& work, int64_t groups_total, int64_t rows_total,
                            int sms, const StreamGemmTuning& t, cudaStream_t stream);

}  // namespace locus::cuda::detail
