// Timed choices between code paths (path_choice.h).
#include "backends/cuda/path_choice.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/env_settings.h"

namespace locus::cuda::detail {
namespace {

struct Choices {
  std::mutex mu;
  std::map<std::string, int> chosen;
};
Choices& choices() {
  static auto* c = new Choices();
  return *c;
}

bool autotune() {
  static const bool on = env_switch("LOCUS_PATH_AUTOTUNE");
  return on;
}

}  // namespace

bool log_choices() {
  static const bool on = env_int("LOCUS_PATH_CHOICE_LOG", 0) != 0;
  return on;
}

bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  LOCUS_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

namespace {

// Two CUDA events, destroyed however the timing ends.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  EventPair() {
    LOCUS_CUDA_CHECK(cudaEventCreate(&start));
    LOCUS_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Twice the L2 of zeros (the last 16 bytes a sink for the sweep), allocated on `stream` for one
// timing and freed after it; nullptr, with the error cleared, where the memory is not there (then
// the runs are timed warm: a choice still gets made, and the model's forward does not fail).
// The L2 is read, not written: a run after it reads its operands from memory, as a model's weights
// are read at decode (each layer's once per step), not from what the run before it left in L2
// (timed warm, a tactic can win on operands that never are), and the lines the run evicts are
// clean, as a decode step's predecessor leaves them.
struct FlushBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  cudaStream_t stream;
  explicit FlushBuffer(cudaStream_t s) : stream(s) {
    int device = 0;
    LOCUS_CUDA_CHECK(cudaGetDevice(&device));
    bytes = 2 * static_cast<size_t>(std::max(device_attribute(device, cudaDevAttrL2CacheSize), 1 << 20));
    if (cudaMallocAsync(&p, bytes + 16, stream) != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
      return;
    }
    LOCUS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes + 16, stream));
  }
  ~FlushBuffer() {
    if (p) cudaFreeAsync(p, stream);
  }
  FlushBuffer(const FlushBuffer&) = delete;
  FlushBuffer& operator=(const FlushBuffer&) = delete;
  unsigned* sink() const { return reinterpret_cast<unsigned*>(static_cast<char*>(p) + bytes); }
};

// Milliseconds of one run of each of `calls` on `stream`: `rounds` rounds in which the calls take
// turns (so that clock drift reaches them alike), each run right after twice the L2 was read
// through it where `flush` is given; per call the best of the rounds after the first (a warm-up).
std::vector<float> time_rounds_ms(const std::vector<std::function<void()>>& calls, cudaStream_t stream, int rounds,
                                  const FlushBuffer* flush) {
  const EventPair ev;
  std::vector<float> best(calls.size(), 1e30f);
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (flush && flush->p) launch_l2_sweep(flush->p, flush->bytes, flush->sink(), stream, /*let_next_start=*/false);
      LOCUS_CUDA_CHECK(cudaEventRecord(ev.start, stream));
      calls[i]();
      LOCUS_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
      LOCUS_CUDA_CHECK(cudaEventSynchronize(ev.stop));
      float ms = 0;
      LOCUS_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
      if (round > 0) best[i] = std::min(best[i], ms);
    }
  }
  return best;
}

// Milliseconds of one call of each path as a captured decode step runs it. A decode step is a
// graph, and eager timing would add each path's host launch work, which differs a lot between one
// kernel (tensor maps, launch attributes) and a fork/join over streams; it picked the fork/join
// where a graph runs the kernel 1.5x faster. Each path is captured behind the L2 read, which both
// empties the L2 and is a kernel before it, as in a step, and a graph of the read alone is timed
// beside them and subtracted. The read lets the path's first kernel start during its last wave,
// as the small kernels before a step's products do (programmatic dependent launch): a read that did
// not made a kernel path pay its whole start and picked fork/joins that run slower back to back
// (docs/benchmarks.md, thirty-second and thirty-third sessions). Each graph, the read's alone
// included, ends with a kernel that waits for the path as a step's next kernel does: it starts
// during a single kernel's tail, but after a fork/join's join only, which a graph ending at the
// join did not charge: on an H100 it took the picks of a path 1.5-1.7x slower than the one launch
// from 4 in 84 NVFP4 table cells to none in 63 (thirty-fifth session).
// Each path runs once eagerly first, so that its own choices (cuBLASLt tactics) and scratch growth
// happen outside the capture.
std::vector<float> time_paths_in_graphs_ms(const std::vector<PathCall>& paths, cudaStream_t stream) {
  for (const auto& path : paths) path(stream);
  const FlushBuffer flush(stream);
  auto read_l2 = [&] {
    if (flush.p) launch_l2_sweep(flush.p, flush.bytes, flush.sink(), stream, /*let_next_start=*/true);
  };
  std::vector<Graph> graphs(paths.size() + 1);  // [0]: the read alone; [i + 1]: the read, then path i
  std::vector<std::function<void()>> replays;
  try {
    for (size_t i = 0; i < graphs.size(); ++i) {
      graphs[i].begin_capture(stream);
      read_l2();
      if (i > 0) paths[i - 1](stream);
      launch_waiting_successor(stream);
      graphs[i].end_capture();
      replays.push_back([&graphs, i, stream] { graphs[i].replay(stream); });
    }
  } catch (const std::exception& e) {
    // A path that cannot be captured here: time them eagerly, so that the op still runs (a
    // capture of it will say what broke).
    if (log_choices()) std::fprintf(stderr, "locus: path choice timed eagerly (capture failed: %s)\n", e.what());
    replays.clear();
    graphs.clear();    // ends the capture that broke
    cudaGetLastError();  // the call that broke it must not fail the next launch's check
    return time_eagerly_ms(paths, stream);
  }
  const std::vector<float> ms = time_rounds_ms(replays, stream, 8, nullptr);
  std::vector<float> out;
  for (size_t i = 1; i < ms.size(); ++i) out.push_back(std::max(ms[i] - ms[0], 0.f));
  return out;
}

// A stream to time paths on: `stream` itself, or where that is a default stream (which cannot be
// captured) a created one, forked from `stream` on construction and joined back on destruction.
class TimingStream {
 public:
  explicit TimingStream(cudaStream_t stream) : caller_(stream) {
    if (stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread) return;
    LOCUS_CUDA_CHECK(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking));
    fork_streams(caller_, {own_});
  }
  ~TimingStream() {
    if (!own_) return;
    try {
      join_streams(caller_, {own_});
    } catch (...) {
    }
    cudaStreamDestroy(own_);
  }
  TimingStream(const TimingStream&) = delete;
  TimingStream& operator=(const TimingStream&) = delete;
  cudaStream_t get() const { return own_ ? own_ : caller_; }

 private:
  cudaStream_t caller_;
  cudaStream_t own_ = nullptr;
};

}  // namespace

std::vector<float> time_eagerly_ms(const std::vector<PathCall>& paths, cudaStream_t stream) {
  const FlushBuffer flush(stream);
  std::vector<std::function<void()>> calls;
  for (const auto& path : paths) calls.push_back([&path, stream] { path(stream); });
  return time_rounds_ms(calls, stream, 4, &flush);
}

std::vector<float> time_in_graphs_ms(const std::vector<PathCall>& paths, cudaStream_t stream) {
  const TimingStream timing(stream);
  return time_paths_in_graphs_ms(paths, timing.get());
}

int chosen_path(const std::string& key) {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.chosen.find(key);
  return it == c.chosen.end() ? -1 : it->second;
}

void run_fastest_path(const std::string& key, const std::vector<PathCall>& paths, cudaStream_t stream) {
  LOCUS_CHECK(!paths.empty(), "run_fastest_path: no paths for ", key);
  int pick = chosen_path(key);
  if (pick < 0) {
    if (paths.size() == 1 || !autotune() || stream_capturing(stream)) {
      pick = 0;
      if (!stream_capturing(stream)) {
        std::lock_guard<std::mutex> lock(choices().mu);
        choices().chosen.emplace(key, pick);
      }
    } else {
      const std::vector<float> ms = time_in_graphs_ms(paths, stream);
      pick = static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
      if (log_choices()) {
        std::string times;
        for (float t : ms) times += str(times.empty() ? "" : ", ", t * 1e3f, " us");
        std::fprintf(stderr, "locus: path choice %s: %s -> path %d\n", key.c_str(), times.c_str(), pick);
      }
      std::lock_guard<std::mutex> lock(choices().mu);
      pick = choices().chosen.emplace(key, pick).first->second;  // another thread may have chosen first
    }
  }
  paths[static_cast<size_t>(pick)](stream);
}

}  // namespace locus::cuda::detail
