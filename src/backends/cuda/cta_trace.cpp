// Host side of CtaTrace (cta_trace.h): reading the records back.
#include "backends/cuda/cta_trace.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "backends/cuda/cuda_check.h"

namespace locus::cuda::detail {

std::vector<std::vector<unsigned long long>> read_cta_trace(const CtaTrace& t, int words) {
  unsigned long long started = 0;
  LOCUS_CUDA_CHECK(cudaMemcpy(&started, t.buf, sizeof started, cudaMemcpyDeviceToHost));
  const size_t n = std::min<unsigned long long>(started, static_cast<unsigned long long>(t.records));
  std::vector<unsigned long long> w(n * words);
  LOCUS_CUDA_CHECK(cudaMemcpy(w.data(), t.buf + kCtaTraceHeader, w.size() * sizeof w[0], cudaMemcpyDeviceToHost));
  std::vector<std::vector<unsigned long long>> records(n);
  for (size_t i = 0; i < n; ++i) records[i].assign(w.begin() + i * words, w.begin() + (i + 1) * words);
  return records;
}

}  // namespace locus::cuda::detail
