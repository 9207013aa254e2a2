// Internal to the CUDA backend: a device-to-host copy that the host waits for later, so that work
// queued on the stream after it keeps the device busy while the host waits (the MoE reads its
// expert offsets this way while the gather and the shared expert run). No CUDA header here.
#pragma once
#include "core/tensor.h"

namespace locus::cuda {

class HostReadback {
 public:
  // Queues the copy of `src` (contiguous, on a CUDA device) on `stream` after the work already
  // there, into pinned host memory, and returns at once. Throws when `stream` is being captured
  // into a CUDA graph (the host read cannot be captured).
  HostReadback(const Tensor& src, void* stream);
  // Waits for a copy never waited for, so that its pinned block can be handed out again.
  ~HostReadback();
  HostReadback(HostReadback&& other) noexcept;
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;
  HostReadback& operator=(HostReadback&&) = delete;

  // Blocks until the copy is done; returns its bytes (src.nbytes() of them), valid while this
  // object lives. nullptr for an empty source.
  const void* wait();

  struct Slot;  // a pinned block and the event that marks its copy done (host_readback.cpp)

 private:
  void release() noexcept;
  Slot* slot_ = nullptr;
};

}  // namespace locus::cuda
