// A timeline of a kernel's CTAs, for benchmarks (bench/cuda/cta_timeline.h reads it back): a
// traced CTA claims a record at its start and stamps %globaltimer into its words at the points
// the kernel names (its own enum of words; word 0 is always the CTA's start).
#pragma once
#include <vector>

namespace locus::cuda::detail {

// Word 0 of `buf` counts the CTAs started; CTA i < records (in start order) owns the words
// buf[kCtaTraceHeader + words * i ...], times in %globaltimer nanoseconds. buf == nullptr: off.
struct CtaTrace {
  unsigned long long* buf = nullptr;
  int records = 0;
};
constexpr int kCtaTraceHeader = 8;
constexpr int kCtaTraceStart = 0;  // every record's word 0

// The records of the CTAs started so far (at most t.records, in start order, `words` words each),
// once the kernels that wrote them have finished.
std::vector<std::vector<unsigned long long>> read_cta_trace(const CtaTrace& t, int words);

}  // namespace locus::cuda::detail
