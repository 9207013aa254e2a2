// A copy of a device tensor to the host that does not drain the stream first: the constructor
// queues it on `stream` after the work already there and returns; wait() blocks until it is
// done. Work queued on the stream in between keeps the device busy while the host waits (the MoE
// queues the gather and the shared expert behind its expert offsets). On CUDA the bytes land in
// pinned memory, so the copy runs at the bus's speed and needs no device-wide wait. A host read
// cannot be part of a CUDA graph: a capturing stream is an Error that says so.
#pragma once
#include <memory>

#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

class HostReadback {
 public:
  // src: contiguous, on any device (on the CPU, wait() returns src itself).
  explicit HostReadback(const Tensor& src, const Stream& stream = {});
  ~HostReadback();  // waits for a copy still in flight
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  // A CPU tensor of src's shape and dtype holding its values, valid while this object lives.
  Tensor wait();

 private:
  struct Pending;  // the backend's copy in flight (host_readback.cpp)
  Tensor src_;
  std::unique_ptr<Pending> pending_;
};

}  // namespace locus::ops
