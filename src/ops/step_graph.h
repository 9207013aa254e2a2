// A step recorded once and replayed many times: on CUDA a CUDA graph, captured on a stream of its
// own and replayed on the caller's; on the CPU the step's function, run again at each replay.
// Both keep one contract, so the CPU tests hold the CUDA form to it: whatever changes between
// replays reaches the step through the contents of tensors it reads, never through host values
// it captured (a CUDA graph freezes those; the CPU form would see them change, and the tests
// compare both against eager steps).
#pragma once
#include <functional>
#include <memory>

#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

class StepGraph {
 public:
  using Body = std::function<Tensor(const Stream& stream)>;

  StepGraph();
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Records `body` for `device`; nothing runs. On CUDA the body's work is captured (after a wait
  // for the device), and its output tensor is kept: every replay overwrites it. Throws an Error
  // naming the cause when the body cannot be captured (an op that reads back to the host or
  // waits for the device, a launch outside the capture stream); the graph is then empty.
  // twin: on CUDA two executable graphs that replays take in turn (cuda::Graph::end_capture), for
  // a step replayed while its last replay may still run; the CPU form has no use for it.
  void record(Device device, Body body, bool twin = false);
  // Runs the recorded step on `stream` (queued, on CUDA) and returns its output.
  Tensor replay(const Stream& stream);
  bool recorded() const;
  // Forgets the recorded step (on CUDA the graph and the scratch it kept go back).
  void clear();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace locus::ops
