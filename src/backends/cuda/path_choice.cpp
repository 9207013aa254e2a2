// Timed choices between code paths (path_choice.h).
#include "backends/cuda/path_choice.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
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

float time_call_ms(const std::function<void()>& call, cudaStream_t stream) {
  // Twice the L2, written before each run: a run then reads its operands from memory, as a
  // model's weights are read at decode (each layer's once per step), not from what the run
  // before it left in L2. (Timed warm, a tactic can win on operands that never are.)
  int device = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&device));
  const size_t flush_bytes = 2 * static_cast<size_t>(std::max(device_attribute(device, cudaDevAttrL2CacheSize), 1 << 20));
  void* flush = nullptr;
  LOCUS_CUDA_CHECK(cudaMallocAsync(&flush, flush_bytes, stream));
  cudaEvent_t e0, e1;
  LOCUS_CUDA_CHECK(cudaEventCreate(&e0));
  LOCUS_CUDA_CHECK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int rep = 0; rep < 4; ++rep) {
    LOCUS_CUDA_CHECK(cudaMemsetAsync(flush, rep, flush_bytes, stream));
    LOCUS_CUDA_CHECK(cudaEventRecord(e0, stream));
    call();
    LOCUS_CUDA_CHECK(cudaEventRecord(e1, stream));
    LOCUS_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    LOCUS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep > 0) best = std::min(best, ms);  // the first run is a warm-up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  LOCUS_CUDA_CHECK(cudaFreeAsync(flush, stream));
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
