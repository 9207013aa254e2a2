// CUDA graph capture and replay around a stream (cudaStream_t as void*), for the executor, the
// tests and the benchmarks. Capture uses cudaStreamCaptureModeThreadLocal so that other threads'
// CUDA calls are not affected; fork/join to other streams (fork_streams) joins them to the capture.
// Scratch that ops allocate and free during the capture stays with the graph until it is
// destroyed; the outputs the caller keeps must live as long as the graph. No CUDA header is
// included here.
#pragma once
#include <vector>

namespace locus::cuda {

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&& o) noexcept;
  Graph& operator=(Graph&& o) noexcept;

  // Starts capturing the work queued on `stream`. Throws when a capture is already running there.
  void begin_capture(void* stream);
  // Ends the capture and instantiates the graph (throws with the reason when capture broke);
  // with twin = true twice, and replays take the two executables in turn: a launch of an
  // executable graph is ordered behind its previous launch, so where the host queues a replay
  // while the last one still runs (decode lookahead), the twin need not wait for it. A graph with
  // memory nodes (stream-ordered allocations) gets one executable: the driver allows no more.
  void end_capture(bool twin = false);
  // Replays the graph on `stream` (asynchronous).
  void replay(void* stream) const;
  bool ready() const { return exec_ != nullptr; }

 private:
  void reset();
  void abandon_capture();  // ends a capture in progress (destroyed or overwritten mid-capture)
  void* capture_stream_ = nullptr;
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  void* twin_ = nullptr;   // a second cudaGraphExec_t of the same graph, or null
  mutable bool twin_next_ = false;  // the next replay takes twin_
  // Device blocks allocated and freed during the capture, which replays still use; given back to
  // the allocator with the graph (capture_state.h).
  std::vector<void*> held_blocks_;
};

// A created stream for captures (blocking: ordered with the legacy default stream), and its end.
void* create_capture_stream(int device_index);
void destroy_stream(void* stream);

// True when `stream` is being captured.
bool stream_is_capturing(void* stream);

// Waits for all work on the device (every stream).
void device_synchronize(int device_index = 0);

}  // namespace locus::cuda
