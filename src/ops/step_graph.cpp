// ops::StepGraph: the CPU form keeps the step function; the CUDA form captures it with cuda::Graph
// on a created stream of its own and keeps the output tensor the capture returned.
#include "ops/step_graph.h"

#include "core/error.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_graph.h"
#endif

namespace locus::ops {

struct StepGraph::Impl {
  Device device = Device::cpu();
  Body body;     // the CPU form
  Tensor output;  // the CUDA form's output, overwritten by each replay
#if defined(LOCUS_WITH_CUDA)
  cuda::Graph graph;
  void* capture_stream = nullptr;
  ~Impl() {
    graph = cuda::Graph();  // before its stream goes
    cuda::destroy_stream(capture_stream);
  }
#endif
};

StepGraph::StepGraph() : impl_(std::make_unique<Impl>()) {}
StepGraph::~StepGraph() = default;

void StepGraph::clear() { impl_ = std::make_unique<Impl>(); }

bool StepGraph::recorded() const {
#if defined(LOCUS_WITH_CUDA)
  if (impl_->graph.ready()) return true;
#endif
  return static_cast<bool>(impl_->body);
}

void StepGraph::record(Device device, Body body, bool twin) {
  LOCUS_CHECK(static_cast<bool>(body), "StepGraph::record: no step to record");
  impl_ = std::make_unique<Impl>();
  impl_->device = device;
  if (device.is_cpu()) {
    impl_->body = std::move(body);
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  Impl& im = *impl_;
  cuda::device_synchronize(device.index);  // the capture stream starts after the caller's work
  im.capture_stream = cuda::create_capture_stream(device.index);
  try {
    im.graph.begin_capture(im.capture_stream);
    im.output = body(Stream{device, im.capture_stream});
    im.graph.end_capture(twin);
  } catch (...) {
    impl_ = std::make_unique<Impl>();  // abandons the capture, gives its blocks back
    throw;
  }
#else
  (void)twin;
  LOCUS_THROW("StepGraph: ", device.name(), " steps need the CUDA backend, which this build does not have");
#endif
}

Tensor StepGraph::replay(const Stream& stream) {
  LOCUS_CHECK(recorded(), "StepGraph::replay before a successful record");
  if (impl_->body) return impl_->body(stream);
#if defined(LOCUS_WITH_CUDA)
  impl_->graph.replay(stream.native);
  return impl_->output;
#else
  return {};
#endif
}

}  // namespace locus::ops
