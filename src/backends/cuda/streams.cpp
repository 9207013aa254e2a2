// Fork/join across streams with a pool of timing-disabled events (capturable; stream events,
// never green-context events, which break stream capture), and CUDA graph helpers.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/capture_state.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/graph_memset_nodes.h"

namespace locus::cuda {
namespace {

// Captured memset nodes become kernel nodes (graph_memset_nodes.h); LOCUS_GRAPH_MEMSET_KERNELS=0
// keeps them.
detail::EnvToggle g_memset_kernels{"LOCUS_GRAPH_MEMSET_KERNELS", true};
// LOCUS_GRAPH_LOG=1: a line per captured graph (its nodes, what end_capture did to it).
detail::EnvToggle g_graph_log{"LOCUS_GRAPH_LOG", false};

// A ring of events. An event may be re-recorded once its earlier record has been waited on:
// cudaStreamWaitEvent binds to the record that precedes it, and during capture a record/wait
// pair only becomes a graph edge. 256 events cover any fork/join width Locus uses.
class EventPool {
 public:
  cudaEvent_t next() {
    std::lock_guard<std::mutex> lock(mu_);
    if (events_.empty()) {
      // Created lazily; in relaxed capture mode so that a first use inside a capture is legal.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      LOCUS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      events_.resize(kSize);
      cudaError_t err = cudaSuccess;
      for (auto& e : events_)
        if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      cudaThreadExchangeStreamCaptureMode(&mode);
      if (err != cudaSuccess) {
        events_.clear();
        LOCUS_CUDA_CHECK_NAMED(err, "creating the fork/join event pool");
      }
    }
    cudaEvent_t e = events_[cursor_];
    cursor_ = (cursor_ + 1) % kSize;
    return e;
  }

 private:
  static constexpr size_t kSize = 256;
  std::mutex mu_;
  std::vector<cudaEvent_t> events_;
  size_t cursor_ = 0;
};

EventPool& pool() {
  static auto* p = new EventPool();  // never destroyed: events outlive static teardown order
  return *p;
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

void fork_streams(void* origin, const std::vector<void*>& targets) {
  if (targets.empty()) return;
  cudaEvent_t e = pool().next();
  LOCUS_CUDA_CHECK(cudaEventRecord(e, as_stream(origin)));
  for (void* t : targets)
    if (t != origin) LOCUS_CUDA_CHECK(cudaStreamWaitEvent(as_stream(t), e, 0));
}

void join_streams(void* origin, const std::vector<void*>& targets) {
  for (void* t : targets) {
    if (t == origin) continue;
    cudaEvent_t e = pool().next();
    LOCUS_CUDA_CHECK(cudaEventRecord(e, as_stream(t)));
    LOCUS_CUDA_CHECK(cudaStreamWaitEvent(as_stream(origin), e, 0));
  }
}

bool detail::small_op_overlap() {
  static detail::EnvToggle toggle("LOCUS_SMALL_OPS_PDL", /*default_on=*/true);
  return toggle.on();
}

void* side_stream(int device_index) {
  static std::mutex mu;
  static std::vector<cudaStream_t> streams;  // per device; never destroyed (graphs may hold them)
  std::lock_guard<std::mutex> lock(mu);
  if (device_index >= static_cast<int>(streams.size())) streams.resize(static_cast<size_t>(device_index) + 1);
  cudaStream_t& s = streams[static_cast<size_t>(device_index)];
  if (s == nullptr) {
    use_device(device_index);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    LOCUS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (err != cudaSuccess) s = nullptr;
    LOCUS_CUDA_CHECK_NAMED(err, "creating the side stream of cuda:" + std::to_string(device_index));
  }
  return s;
}

void* create_capture_stream(int device_index) {
  LOCUS_CUDA_CHECK(cudaSetDevice(device_index));
  cudaStream_t s = nullptr;
  LOCUS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
  return s;
}

void destroy_stream(void* stream) {
  if (stream && cudaStreamDestroy(as_stream(stream)) != cudaSuccess) cudaGetLastError();
}

bool stream_is_capturing(void* stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  LOCUS_CUDA_CHECK(cudaStreamIsCapturing(as_stream(stream), &st));
  return st == cudaStreamCaptureStatusActive;
}

void device_synchronize(int device_index) {
  LOCUS_CUDA_CHECK(cudaSetDevice(device_index));
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
}

Graph::~Graph() {
  abandon_capture();
  reset();
}

void Graph::abandon_capture() {
  if (!capture_stream_) return;
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(as_stream(capture_stream_), &g) == cudaSuccess && g) cudaGraphDestroy(g);
  cudaGetLastError();
  capture_stream_ = nullptr;
  std::vector<void*> blocks = detail::capture_ended();
  detail::release_capture_blocks(blocks);  // nothing was captured that could still use them
}

Graph::Graph(Graph&& o) noexcept { *this = std::move(o); }

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    abandon_capture();
    reset();
    capture_stream_ = o.capture_stream_;
    graph_ = o.graph_;
    exec_ = o.exec_;
    twin_ = o.twin_;
    twin_next_ = o.twin_next_;
    held_blocks_ = std::move(o.held_blocks_);
    o.capture_stream_ = o.graph_ = o.exec_ = o.twin_ = nullptr;
    o.held_blocks_.clear();
  }
  return *this;
}

void Graph::reset() {
  // Teardown errors are dropped, so that the next launch's check does not report them as its own.
  if (exec_ && cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)) != cudaSuccess) cudaGetLastError();
  if (twin_ && cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(twin_)) != cudaSuccess) cudaGetLastError();
  if (graph_ && cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)) != cudaSuccess) cudaGetLastError();
  exec_ = twin_ = graph_ = nullptr;
  twin_next_ = false;
  detail::release_capture_blocks(held_blocks_);
}

void Graph::begin_capture(void* stream) {
  LOCUS_CHECK(stream != nullptr, "Graph::begin_capture needs a created stream, not the legacy default stream");
  LOCUS_CHECK(!stream_is_capturing(stream), "Graph::begin_capture: the stream is already being captured");
  reset();
  LOCUS_CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
  capture_stream_ = stream;
  detail::capture_started();
}

void Graph::end_capture(bool twin) {
  LOCUS_CHECK(capture_stream_ != nullptr, "Graph::end_capture without begin_capture");
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(as_stream(capture_stream_), &g);
  capture_stream_ = nullptr;
  held_blocks_ = detail::capture_ended();
  LOCUS_CUDA_CHECK_NAMED(e, "ending the CUDA graph capture (a stream was not joined back, or an op broke capture)");
  graph_ = g;
  const int memsets = g_memset_kernels.on() ? detail::memset_nodes_to_kernels(g) : 0;
  cudaGraphExec_t ex = nullptr;
  LOCUS_CUDA_CHECK(cudaGraphInstantiate(&ex, g, 0));
  exec_ = ex;
  // A graph with memory nodes may be instantiated only once at a time: it replays from one.
  const bool memory_nodes = detail::has_memory_nodes(g);
  if (g_graph_log.on()) {
    size_t nodes = 0;
    cudaGraphGetNodes(g, nullptr, &nodes);
    std::fprintf(stderr, "locus: graph captured: %zu nodes, %d memsets as kernels, memory nodes %s, %s\n", nodes,
                 memsets, memory_nodes ? "yes" : "no", twin && !memory_nodes ? "two executables" : "one executable");
  }
  if (twin && !memory_nodes) {
    cudaGraphExec_t second = nullptr;
    LOCUS_CUDA_CHECK(cudaGraphInstantiate(&second, g, 0));
    twin_ = second;
  }
}

void Graph::replay(void* stream) const {
  LOCUS_CHECK(exec_ != nullptr, "Graph::replay before a successful capture");
  void* exec = twin_ && twin_next_ ? twin_ : exec_;
  LOCUS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), as_stream(stream)));
  if (twin_) twin_next_ = !twin_next_;
}

}  // namespace locus::cuda
