// Internal to the CUDA backend: the per-(device, stream) work counters and fp32 partial sums that
// the weight kernels (stream_gemm.h, nvfp4_wgmma.h) share. Kernels on one stream run in order,
// and each leaves every counter at zero when it ends, so they can share one set. Attention keeps
// a set of its own (its split partials live from the attention kernel to the merge, and a weight
// kernel launched as a programmatic dependent may start before they are read).
// Why not cudaMallocAsync: in a captured graph it makes memory nodes, and a graph with memory
// nodes can be instantiated only once at a time (no twin executables) and has no node that can
// be removed (no memset conversion, graph_memset_nodes.h).
#pragma once
#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstddef>

namespace locus::cuda::detail {

struct StreamScratch {
  unsigned* counters = nullptr;
  size_t counter_cap = 0;
  float4* partials = nullptr;
  size_t partial_cap = 0;
  unsigned long long* claim_words = nullptr;  // stream_claim_scratch
};
// At least `counters` counters (zero) and `partials` float4 partial slots for `stream` on the
// current device, grown on demand (an outgrown buffer is kept alive: a captured graph may still
// use it). Capturable: allocations happen in relaxed capture mode.
enum class ScratchUser { kWeightKernels, kAttention };
StreamScratch stream_scratch(cudaStream_t stream, size_t counters, size_t partials,
                             ScratchUser user = ScratchUser::kWeightKernels);

// stream_scratch's counters (no partials) and, in the same lookup, the domain-aware launches'
// arrival and claim words on `stream` (unit_claims.cuh), on the current device, zeroed once and
// never reset (a launch counts itself into the arrival words and tags what it claims with that
// count): kClaimWordsPerSm x `sms` arrival words, then two sets of as many claim words; `sms`:
// sm_count_for(stream). A launch has at most that many CTAs and units (8 CTAs of 256 threads an SM).
constexpr int kClaimWordsPerSm = 8;
StreamScratch stream_claim_scratch(cudaStream_t stream, size_t counters, int sms);

// SMs a kernel launched on `stream` may use: its green-context partition's, else the device's.
int sm_count_for(cudaStream_t stream);

}  // namespace locus::cuda::detail
