// Device benchmarks' shared timing helpers: CUDA-event timing of captured graphs (median of
// replays), how many rotating weight copies to time over, the device copy bandwidth, random bf16
// fills, the two emulated domains, the --m option. Header-only, for the bench/cuda mains.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include <string>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "core/float_convert.h"
#include "core/tensor.h"

namespace locus::bench {

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// What a device benchmark's main starts with: stdout line-buffered (each row as it is measured,
// also into a file) and a non-blocking stream in *s. False, after saying so, without a device.
inline bool start_device_bench(cudaStream_t* s) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!cuda::device_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return false;
  }
  CK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
  return true;
}

// Seconds of one replay of `g` on `s`, between the events `a` and `b`.
inline double replay_seconds(const cuda::Graph& g, cudaStream_t s, cudaEvent_t a, cudaEvent_t b) {
  CK(cudaEventRecord(a, s));
  g.replay(s);
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms * 1e-3;
}

// Median seconds per call of a graph that holds `calls` calls, over `reps` replays.
inline double time_graph(const cuda::Graph& g, cudaStream_t s, int calls, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) g.replay(s);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(replay_seconds(g, s, a, b) / calls);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

inline cuda::Graph capture(cudaStream_t s, const std::function<void()>& body) {
  body();  // eager once: tactic tuning and scratch growth happen outside the capture
  CK(cudaStreamSynchronize(s));
  cuda::device_synchronize(0);
  cuda::Graph g;
  g.begin_capture(s);
  body();
  g.end_capture();
  return g;
}

// Times several captured graphs against each other: each is replayed in turn, one replay per
// graph per round, so that clock and temperature drift over a long run reach them all alike (timed
// one after another, a later column could be slower only for coming later).
class InterleavedTimer {
 public:
  explicit InterleavedTimer(cudaStream_t s) : s_(s) {}
  // Captures one(0), ..., one(calls - 1) back to back (run once eagerly first) as a graph to be
  // timed into *out, in seconds per call.
  void add(double* out, int calls, const std::function<void(int)>& one) {
    auto all = [&] {
      for (int r = 0; r < calls; ++r) one(r);
    };
    entries_.push_back({capture(s_, all), calls, out});
  }
  // Three untimed replays of each, then `reps` rounds; writes each graph's median.
  void run(int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (auto& e : entries_)
      for (int i = 0; i < 3; ++i) e.graph.replay(s_);
    std::vector<std::vector<double>> t(entries_.size());
    for (int rep = 0; rep < reps; ++rep) {
      for (size_t i = 0; i < entries_.size(); ++i)
        t[i].push_back(replay_seconds(entries_[i].graph, s_, a, b) / entries_[i].calls);
    }
    for (size_t i = 0; i < entries_.size(); ++i) *entries_[i].out = median(t[i]);
    entries_.clear();
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }

 private:
  struct Entry {
    cuda::Graph graph;
    int calls;
    double* out;
  };
  cudaStream_t s_;
  std::vector<Entry> entries_;
};

// How many copies of a weight of `bytes` to rotate through so that they total > 240 MB (four times
// the H200's L2) and each call reads its weights from memory: 2..max_copies.
inline int rotating_copies(double bytes, int max_copies = 16) {
  return static_cast<int>(std::clamp(std::ceil(240e6 / bytes), 2.0, static_cast<double>(max_copies)));
}

// Device-to-device copy bandwidth (bytes read + written per second), 2 GiB.
inline double copy_bandwidth(cudaStream_t s) {
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 12; ++i) {
    CK(cudaEventRecord(e0, s));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) t.push_back(ms * 1e-3);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / median(t);
}

// Fills a device buffer with random bf16 (normal, stddev 0.05) from a host pattern.
inline void fill_random_bf16(const Tensor& t, std::mt19937_64& rng) {
  static std::vector<uint16_t> pattern;
  if (pattern.empty()) {
    pattern.resize(size_t(8) << 20);
    std::normal_distribution<float> d(0.f, 0.05f);
    for (auto& v : pattern) v = f32_to_bf16_bits(d(rng));
  }
  const size_t n = static_cast<size_t>(t.numel());
  auto* dst = static_cast<uint16_t*>(t.data_ptr());
  for (size_t off = 0; off < n; off += pattern.size()) {
    size_t len = std::min(pattern.size(), n - off);
    size_t start = rng() % (pattern.size() - len + 1);
    CK(cudaMemcpy(dst + off, pattern.data() + start, len * 2, cudaMemcpyHostToDevice));
  }
}

// The split of a command line whose only option is `--split backfill|aligned` (default backfill).
// Returns 0 with *split set, else 2 after naming the unknown argument and printing `usage`.
inline int split_from_args(int argc, char** argv, const char* usage, std::string* split) {
  *split = "backfill";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--split" && i + 1 < argc) {
      *split = argv[++i];
    } else {
      std::fprintf(stderr, "unknown argument '%s'\nusage: %s\n", a.c_str(), usage);
      return 2;
    }
  }
  return 0;
}

// The benchmarks' two emulated locality domains (green-context SM partitions, `split` backfill or
// aligned). Returns 0 with *parts filled, else the exit code after saying why on stderr.
inline int make_two_domains(const std::string& split, std::vector<cuda::SmPartition>* parts) {
  if (split != "backfill" && split != "aligned") {
    std::fprintf(stderr, "--split must be backfill or aligned, got '%s'\n", split.c_str());
    return 2;
  }
  if (!cuda::device_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  *parts = cuda::create_sm_partitions(0, 2, split == "aligned" ? cuda::SplitMode::kAligned : cuda::SplitMode::kBackfill);
  return 0;
}

// The --m option: comma-separated M values in 1..max_m. False (after saying why on stderr)
// otherwise.
inline bool parse_m_list(const std::string& list, int64_t max_m, std::vector<int64_t>* ms) {
  ms->clear();
  for (size_t at = 0; at < list.size();) {
    const long long m = std::atoll(list.c_str() + at);
    if (m < 1 || m > max_m) {
      if (max_m == INT64_MAX) std::fprintf(stderr, "--m must be a comma-separated list of positive M values, got '%s'\n", list.c_str());
      else std::fprintf(stderr, "--m must be a comma-separated list of M values in 1..%lld, got '%s'\n",
                        static_cast<long long>(max_m), list.c_str());
      return false;
    }
    ms->push_back(m);
    const size_t comma = list.find(',', at);
    at = comma == std::string::npos ? list.size() : comma + 1;
  }
  return true;
}

// DeepSeek-V3's weight shapes (N x K) that the GEMM benchmarks time.
using Shapes = std::vector<std::pair<int64_t, int64_t>>;
inline Shapes deepseek_v3_shapes() {
  return {{7168, 7168}, {18432, 7168}, {7168, 18432}, {4096, 7168}, {24576, 1536}, {32768, 512}, {7168, 2048}};
}

// The --shape option: NxK with N and K positive multiples of n_align and k_align (at least 16 for
// K), or, when `arg` is empty, deepseek_v3_shapes(). False (after saying why on stderr) otherwise.
inline bool parse_shapes(const std::string& arg, int64_t n_align, int64_t k_align, Shapes* shapes) {
  if (arg.empty()) {
    *shapes = deepseek_v3_shapes();
    return true;
  }
  long long n = 0, k = 0;
  if (std::sscanf(arg.c_str(), "%lldx%lld", &n, &k) != 2 || n < n_align || k < std::max<int64_t>(k_align, 16) ||
      n % n_align != 0 || k % k_align != 0) {
    std::fprintf(stderr, "--shape must be NxK with N a multiple of %lld and K of %lld (at least 16), got '%s'\n",
                 static_cast<long long>(n_align), static_cast<long long>(k_align), arg.c_str());
    return false;
  }
  *shapes = {{n, k}};
  return true;
}

}  // namespace locus::bench
