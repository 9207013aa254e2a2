#include "ops/side_stream.h"

#include "core/device_hooks.h"
#include "core/env_switch.h"
#include "core/error.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_ops.h"
#endif

namespace locus::ops {

namespace {

// LOCUS_SIDE_STREAM=0 queues side work on the caller's stream (an A/B switch; read once).
bool side_streams_on() {
  static const bool on = env_switch_on("LOCUS_SIDE_STREAM");
  return on;
}

}  // namespace

SideStream::SideStream(const Stream& caller) : caller_(caller), side_(caller) {
  if (caller.device.is_cpu() || !side_streams_on()) return;
#if defined(LOCUS_WITH_CUDA)
  side_ = Stream{caller.device, cuda::side_stream(caller.device.index)};
  cuda::fork_streams(caller.native, {side_.native});
#else
  LOCUS_THROW("SideStream: ", caller.device.name(), " needs the CUDA backend, which this build does not have");
#endif
}

SideStream::~SideStream() {
  try {
    join();
  } catch (...) {  // a failed join leaves the error to the caller's next CUDA call
  }
}

void SideStream::run(const std::function<void(const Stream&)>& fn) {
  LOCUS_CHECK(!joined_, "SideStream: run() after join()");
  if (side_.native == caller_.native) return fn(caller_);
  AllocationDomainScope scope(kSideStreamDomain);
  fn(side_);
}

void SideStream::join() {
  if (joined_) return;
  joined_ = true;
#if defined(LOCUS_WITH_CUDA)
  if (side_.native != caller_.native) cuda::join_streams(caller_.native, {side_.native});
#endif
}

}  // namespace locus::ops
