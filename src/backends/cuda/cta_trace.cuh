// Device side of CtaTrace (cta_trace.h): the clock, claiming a record, stamping a word.
#pragma once
#include "backends/cuda/cta_trace.h"

namespace locus::cuda::detail {

// The global nanosecond timer (it ticks in 0.256 us steps on the H200).
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread per CTA, at its start: claims the next record of `t` (records of `words` words) and
// stamps its start. nullptr when tracing is off or every record is taken.
__device__ __forceinline__ unsigned long long* open_trace_record(const CtaTrace& t, int words) {
  if (t.buf == nullptr) return nullptr;
  const unsigned long long now = global_ns(), i = atomicAdd(t.buf, 1ull);
  if (i >= static_cast<unsigned long long>(t.records)) return nullptr;
  unsigned long long* rec = t.buf + kCtaTraceHeader + static_cast<unsigned long long>(words) * i;
  rec[kCtaTraceStart] = now;
  return rec;
}

// Stamps word `w` of a record (nothing when tracing is off).
__device__ __forceinline__ void stamp(unsigned long long* rec, int w) {
  if (rec != nullptr) rec[w] = global_ns();
}

// Stamps word `w` unless it holds a time already (the records start zeroed: CtaTraceBuffer).
__device__ __forceinline__ void stamp_once(unsigned long long* rec, int w) {
  if (rec != nullptr && rec[w] == 0) rec[w] = global_ns();
}

}  // namespace locus::cuda::detail
