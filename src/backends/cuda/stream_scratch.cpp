// Per-stream scratch of the weight kernels (stream_scratch.h).
#include "backends/cuda/stream_scratch.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/persistent_alloc.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda::detail {

namespace {

std::mutex g_scratch_mu;

// The scratch of `stream` and `user` on the current device; the caller holds g_scratch_mu.
StreamScratch& scratch_of(cudaStream_t stream, ScratchUser user) {
  static auto* all = new std::map<std::tuple<int, cudaStream_t, ScratchUser>, StreamScratch>();
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  return (*all)[{dev, stream, user}];
}

// Grows `s` to at least `counters` counters and `partials` partial slots; the caller holds g_scratch_mu.
void grow(StreamScratch& s, size_t counters, size_t partials) {
  if (s.partial_cap < partials) {
    const size_t cap = std::max(partials, 2 * s.partial_cap);
    // Partials are written before they are read; they need no initialization (zeroed anyway).
    s.partials = static_cast<float4*>(persistent_device_alloc(cap * sizeof(float4), nullptr, "allocating per-stream partials"));
    s.partial_cap = cap;
  }
  if (s.counter_cap < counters) {
    const size_t cap = std::max(counters, 2 * s.counter_cap);
    s.counters = static_cast<unsigned*>(persistent_device_alloc(cap * sizeof(unsigned), nullptr, "allocating per-stream counters"));
    s.counter_cap = cap;
  }
}

}  // namespace

StreamScratch stream_scratch(cudaStream_t stream, size_t counters, size_t partials, ScratchUser user) {
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  StreamScratch& s = scratch_of(stream, user);
  grow(s, counters, partials);
  return s;
}

StreamScratch stream_claim_scratch(cudaStream_t stream, size_t counters, int sms) {
  std::lock_guard<std::mutex> lock(g_scratch_mu);
  StreamScratch& s = scratch_of(stream, ScratchUser::kWeightKernels);
  grow(s, counters, 0);
  if (s.claim_words == nullptr) {
    const size_t bytes = 3 * sizeof(unsigned long long) * kClaimWordsPerSm * sms;
    s.claim_words = static_cast<unsigned long long*>(persistent_device_alloc(bytes, nullptr, "allocating claim words"));
  }
  return s;
}

int sm_count_for(cudaStream_t stream) {
  const int part = partition_stream_sm_count(stream);
  if (part > 0) return part;
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  return sms;
}

}  // namespace locus::cuda::detail
