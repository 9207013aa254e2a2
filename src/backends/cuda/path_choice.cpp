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

// LOCUS_PATH_CHOICE_LOG=1: each timed choice is printed to stderr (key, each path's time, pick).
bool log_choices() {
  static const bool on = env_int("LOCUS_PATH_CHOICE_LOG", 0) != 0;
  return on;
}

}  // namespace

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
// through it; per call the best of the rounds after the first (a warm-up).
std::vector<float> time_rounds_ms(const std::vector<std::function<void()>>& calls, cudaStream_t stream, int rounds) {
  // The L2 is read, not written: the run then reads its operands from memory, as a model's
  // weights are read at decode (each layer's once per step), not from what the run before it left
  // in L2 (timed warm, a tactic can win on operands that never are), and the lines the run evicts
  // are clean, as a decode step's predecessor leaves them.
  const FlushBuffer flush(stream);
  const EventPair ev;
  std::vector<float> best(calls.size(), 1e30f);
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (flush.p) launch_l2_sweep(flush.p, flush.bytes, flush.sink(), stream);
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

// Milliseconds of one call of each path as a captured graph runs it (time_rounds_ms over replays
// of a graph of the path). A decode step is a graph, and eager timing would add each path's host
// launch work, which differs a lot between one kernel (tensor maps, launch attributes) and a
// fork/join over streams; it picked the fork/join where a graph runs the kernel 1.5x faster.
// Each path runs once eagerly first, so that its own choices (cuBLASLt tactics) and scratch growth
// happen outside the capture.
std::vector<float> time_paths_in_graphs_ms(const std::vector<std::function<void()>>& paths, cudaStream_t stream) {
  for (const auto& path : paths) path();
  std::vector<Graph> graphs(paths.size());
  std::vector<std::function<void()>> replays;
  try {
    for (size_t i = 0; i < paths.size(); ++i) {
      graphs[i].begin_capture(stream);
      paths[i]();
      graphs[i].end_capture();
      replays.push_back([&graphs, i, stream] { graphs[i].replay(stream); });
    }
  } catch (const std::exception& e) {
    // A path that cannot be captured here: time them eagerly, so that the op still runs (a
    // capture of it will say what broke).
    if (log_choices()) std::fprintf(stderr, "locus: path choice timed eagerly (capture failed: %s)\n", e.what());
    replays.clear();
    graphs.clear();  // ends the capture that broke
    return time_rounds_ms(paths, stream, 4);
  }
  return time_rounds_ms(replays, stream, 4);
}

}  // namespace

float time_call_ms(const std::function<void()>& call, cudaStream_t stream) {
  return time_rounds_ms({call}, stream, 4)[0];
}

int chosen_path(const std::string& key) {
  Choices& c = choices();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.chosen.find(key);
  return it == c.chosen.end() ? -1 : it->second;
}

void run_fastest_path(const std::string& key, const std::vector<std::function<void()>>& paths, cudaStream_t stream) {
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
      const std::vector<float> ms = time_paths_in_graphs_ms(paths, stream);
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
  paths[static_cast<size_t>(pick)]();
}

}  // namespace locus::cuda::detail
