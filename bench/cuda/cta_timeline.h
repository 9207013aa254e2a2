// Reading back a kernel's CTA timeline (src/backends/cuda/cta_trace.h) after one traced replay of
// a graph of back-to-back launches: the records, grouped into launches in start order, as us from
// each launch's first CTA start. Header-only, for the bench/cuda timeline mains.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "backends/cuda/cta_trace.h"
#include "graph_timing.h"

namespace locus::bench {

struct TracedLaunch {
  std::vector<std::vector<double>> at;  // at[word][cta]: us from the launch's first CTA start
  double next = 0;                      // us to the next launch's first CTA start (0: the last)
  double median(int word) const { return bench::median(at[word]); }
  double last(int word) const { return *std::max_element(at[word].begin(), at[word].end()); }
};

// A device buffer for `records` records of `words` words.
class CtaTraceBuffer {
 public:
  CtaTraceBuffer(int records, int words) : words_(words) {
    trace_.records = records;
    CK(cudaMalloc(reinterpret_cast<void**>(&trace_.buf),
                  (cuda::detail::kCtaTraceHeader + size_t(records) * words) * sizeof(unsigned long long)));
  }
  ~CtaTraceBuffer() { cudaFree(trace_.buf); }
  CtaTraceBuffer(const CtaTraceBuffer&) = delete;
  CtaTraceBuffer& operator=(const CtaTraceBuffer&) = delete;

  const cuda::detail::CtaTrace& trace() const { return trace_; }

  // Replays `g` (`launches` launches of the traced kernel) three times to warm up, then once with
  // the records zeroed, and returns that replay's launches: the records in start order, cut
  // into `launches` equal groups.
  std::vector<TracedLaunch> replay(const cuda::Graph& g, cudaStream_t s, int launches) {
    for (int i = 0; i < 3; ++i) g.replay(s);
    const size_t words = cuda::detail::kCtaTraceHeader + size_t(trace_.records) * words_;
    CK(cudaMemsetAsync(trace_.buf, 0, words * sizeof(unsigned long long), s));
    g.replay(s);
    CK(cudaStreamSynchronize(s));
    const auto recs = cuda::detail::read_cta_trace(trace_, words_);
    if (recs.size() >= static_cast<size_t>(trace_.records))  // launches cut wrongly: some CTAs had no record
      std::fprintf(stderr, "CtaTraceBuffer: all %d records taken; the timeline is incomplete\n", trace_.records);
    const int ctas = static_cast<int>(recs.size()) / launches;
    std::vector<TracedLaunch> out(launches);
    std::vector<unsigned long long> t0(launches, ~0ull);
    for (int l = 0; l < launches; ++l)
      for (int i = 0; i < ctas; ++i) t0[l] = std::min(t0[l], recs[l * ctas + i][cuda::detail::kCtaTraceStart]);
    for (int l = 0; l < launches; ++l) {
      out[l].at.assign(words_, std::vector<double>(ctas));
      for (int i = 0; i < ctas; ++i)
        for (int k = 0; k < words_; ++k)
          out[l].at[k][i] = (static_cast<double>(recs[l * ctas + i][k]) - static_cast<double>(t0[l])) * 1e-3;
      out[l].next = l + 1 < launches ? (static_cast<double>(t0[l + 1]) - static_cast<double>(t0[l])) * 1e-3 : 0;
    }
    return out;
  }

 private:
  cuda::detail::CtaTrace trace_;
  int words_;
};

// The median over the inner launches (the first follows other work, the last has no next) of f.
inline double inner_median(const std::vector<TracedLaunch>& launches, const std::function<double(const TracedLaunch&)>& f) {
  std::vector<double> v;
  for (size_t l = 1; l + 1 < launches.size(); ++l) v.push_back(f(launches[l]));
  return median(v);
}

// Medians over the inner launches of: each launch's median of a word (at), its last (last), its
// period (next).
struct InnerMedians {
  const std::vector<TracedLaunch>& launches;
  double at(int word) const {
    return inner_median(launches, [word](const TracedLaunch& l) { return l.median(word); });
  }
  double last(int word) const {
    return inner_median(launches, [word](const TracedLaunch& l) { return l.last(word); });
  }
  double next() const {
    return inner_median(launches, [](const TracedLaunch& l) { return l.next; });
  }
};

}  // namespace locus::bench
