// Internal to the CUDA backend: the NVFP4 weight-only GEMM for decode batches (M up to 64) on
// Hopper tensor cores through wgmma, y[M, N] = x[M, K] W^T with W in kCudaTiled (nvfp4_layout.h).
//
// Why a second NVFP4 kernel: the streaming kernel (stream_gemm.h) gives each warp its own K range
// of 64 rows and its own copy of the activations, and issues mma.sync per 8 tokens; from M = 17 its
// activation traffic and mma issue grow with M (M = 64 ran as two 32-row launches at 0.23-0.70x of
// BF16 cuBLAS's speed on the H200). Here a CTA streams a block of 256 weight rows (4 row groups)
// per 64-K chunk through a cp.async ring and stages the chunk's activations once for all of them;
// each warpgroup (one per row group at N = 32, one per two at N = 64 or with SwiGLU, where a
// group's gate and up rows go together) dequantizes its rows into registers (the exact
// dequantization of mma_fragments.cuh) and issues wgmma.m64nNk16 with the A operand from
// registers and the activations from shared memory (N = 32 or 64 tokens), so a
// chunk's weights are dequantized once whatever M is. The activations are copied in 4-byte pairs
// into the K order of the dequantized registers (a permutation within each 64-K chunk).
//
// Work: per domain, the blocks of its parts (a part is a weight or a domain's shard) laid end to
// end, C = ceil(K / 64) chunks each, cut stream-K into about one unit per resident CTA (one CTA of
// 512 or 256 threads per SM). CTAs take units from their own domain's counter first (the %smid ->
// domain table), then the others'. A unit's segment that is a whole block writes y directly;
// otherwise it stores an fp32 partial and the block's last segment (an atomic count) adds the
// partials in segment order (deterministic) and writes y. SwiGLU's silu(gate) * up is formed in
// registers. Capturable; counters reset themselves; programmatic dependent launch as the
// streaming kernel.
#pragma once
#include <cuda_runtime_api.h>

#include "backends/cuda/stream_gemm.h"

namespace locus::cuda::detail {

constexpr int kNvfp4WgmmaMaxM = 64;

// True when this kernel takes `a`: NVFP4 parts (no batches, no per-part activations),
// 1 <= m <= kNvfp4WgmmaMaxM, K % 16 == 0, x rows 16-byte aligned.
bool nvfp4_wgmma_eligible(const StreamGemmArgs& a);
// Launches on `stream`; throws on arguments it does not take.
void launch_nvfp4_wgmma(StreamGemmArgs& a, cudaStream_t stream);

// Whether NVFP4 GEMMs of M rows and reduction length K use this kernel rather than the streaming
// kernel: from M = 33 (the streaming kernel would take two launches), and from M = 17 where K is
// short. On the H200 (2026-12-03, docs/benchmarks.md) this kernel was 1.2-2.4x faster than the
// streaming one at M = 48 and 64 on every DeepSeek-V3 shape; at M = 24 and 32 it was faster by
// 1.4-1.7x on 24576 x 1536 and 32768 x 512, and (an earlier build) slower by up to 14 % where
// K >= 2048.
// LOCUS_NVFP4_WGMMA_MIN_M = N (or set_nvfp4_wgmma_min_m(N), N > 0; 0 restores the rule) makes
// it "M >= N" whatever K is.
constexpr int kNvfp4WgmmaMinM = 33, kNvfp4WgmmaMinMShortK = 17;
constexpr int64_t kNvfp4WgmmaShortK = 1536;
bool nvfp4_use_wgmma(int64_t m, int64_t k);
void set_nvfp4_wgmma_min_m(int m);
int nvfp4_wgmma_forced_min_m();  // the N in force (0: the rule)

}  // namespace locus::cuda::detail
