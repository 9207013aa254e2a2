// Timed choices between code paths (path_choice.h).
#include "backends/cuda/path_choice.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
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

}  // namespace

float time_call_ms(const std::function<void()>& call, cudaStream_t stream) {
  // Before each run, twice the L2 is read through it: the run then reads its operands from
  // memory, as a model's weights are read at decode (each layer's once per step), not from what the
  // run before it left in L2 (timed warm, a tactic can win on operands that never are). A read, not
  // a write: the lines the run evicts are clean, as a decode step's predecessor leaves them.
  const FlushBuffer flush(stream);
  const EventPair ev;
  float best = 1e30f;
  for (int rep = 0; rep < 4; ++rep) {
    if (flush.p) launch_l2_sweep(flush.p, flush.bytes, flush.sink(), stream);
    LOCUS_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    call();
    LOCUS_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
    LOCUS_CUDA_CHECK(cudaEventSynchronize(ev.stop));
    float ms = 0;
    LOCUS_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    if (rep > 0) best = std::min(best, ms);  // the first run is a warm-up
  }
  return best;
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
      std::vector<float> ms;
      for (const auto& path : paths) ms.push_back(time_call_ms(path, stream));
      pick = static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
      std::lock_guard<std::mutex> lock(choices().mu);
      pick = choices().chosen.emplace(key, pick).first->second;  // another thread may have chosen first
    }
  }
  paths[static_cast<size_t>(pick)]();
}

}  // namespace locus::cuda::detail
