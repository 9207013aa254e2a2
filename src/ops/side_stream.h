// A second stream beside the caller's, for work independent of what the caller queues next (MLA's
// latent rows beside its queries in a decode step), so that short latency-bound kernels of the two
// run side by side instead of one after the other.
//
//   ops::SideStream side(stream);               // fork: side work starts after stream's queue
//   side.run([&](const Stream& s) { ... });     // queued on the side stream
//   ...work on stream...
//   side.join();                                // stream's next work waits for the side's
//
// On CUDA the side stream is one per device, made on first use, and its work allocates from a
// pool of its own (AllocationDomainScope, kSideStreamDomain), so a block it frees while its
// kernels still run never goes to the caller's stream. Capturable: the side stream joins the
// caller's capture at the fork and leaves it at the join. On the CPU, run() calls the function on
// the caller's stream at once and join() does nothing; so does CUDA with LOCUS_SIDE_STREAM=0.
#pragma once
#include <functional>

#include "core/stream.h"

namespace locus::ops {

// The allocation domain of side-stream work (beyond any locality domain).
constexpr int kSideStreamDomain = 1 << 20;

class SideStream {
 public:
  explicit SideStream(const Stream& caller);
  ~SideStream();  // joins, if join() was not called
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  void run(const std::function<void(const Stream&)>& fn);
  void join();

 private:
  Stream caller_, side_;
  bool joined_ = false;
};

}  // namespace locus::ops
