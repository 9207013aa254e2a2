// Do the two branches of a fork/join across the emulated domains' green-context streams run at
// the same time? Each branch is one launch of a kernel whose CTAs stamp %globaltimer when they
// start and end (spinning for a set time, or streaming a buffer from memory); the probe prints,
// per scenario, each branch's span and how much of the shorter span the other overlaps.
// Scenarios: green-context streams or ordinary streams; eager launches or a replayed CUDA graph
// (a chain of several fork/joins, as the benchmarks' graphs hold). Run it under different
// CUDA_DEVICE_MAX_CONNECTIONS values to see whether the hardware queues serialize the branches.
// usage: cuda_green_overlap_probe [--split backfill|aligned]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cta_trace.cuh"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "graph_timing.h"
#include "probe_timing.h"

using namespace locus;

namespace {

using cuda::detail::global_ns;

// Each CTA: stamp, then spin `spin_ns` (spin_ns > 0) or read its share of `src` (spin_ns == 0),
// stamp again; thread 0 stores (start, end) at stamps[2 * blockIdx.x].
__global__ void stamped(unsigned long long* stamps, long long spin_ns, const uint4* src, long long n16, int* sink) {
  const unsigned long long t0 = global_ns();
  if (spin_ns > 0) {
    while (global_ns() - t0 < static_cast<unsigned long long>(spin_ns)) {
    }
  } else {
    uint32_t acc = 0;
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += static_cast<long long>(gridDim.x) * blockDim.x) {
      const uint4 v = src[i];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) atomicAdd(sink, 1);  // keeps the loads
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    stamps[2 * blockIdx.x] = t0;
    stamps[2 * blockIdx.x + 1] = global_ns();
  }
}

struct Span {
  double start = 0, end = 0;
};

Span span_of(const std::vector<unsigned long long>& st, int ctas) {
  unsigned long long s = ~0ull, e = 0;
  for (int b = 0; b < ctas; ++b) {
    s = std::min(s, st[2 * b]);
    e = std::max(e, st[2 * b + 1]);
  }
  return {static_cast<double>(s), static_cast<double>(e)};
}

struct Branches {
  cudaStream_t stream[2];
  unsigned long long* stamps[2];  // device, 2 per CTA
  int ctas;
  long long spin_ns;
  const uint4* src[2];
  long long n16;
  int* sink;
};

// One fork/join: caller -> both branch streams -> caller.
void fork_join(const Branches& b, cudaStream_t caller) {
  std::vector<void*> targets = {b.stream[0], b.stream[1]};
  cuda::fork_streams(caller, targets);
  for (int i = 0; i < 2; ++i)
    stamped<<<b.ctas, 256, 0, b.stream[i]>>>(b.stamps[i], b.spin_ns, b.src[i], b.n16, b.sink);
  cuda::join_streams(caller, targets);
}

void report(const char* label, const Branches& b) {
  std::vector<unsigned long long> h[2];
  Span sp[2];
  for (int i = 0; i < 2; ++i) {
    h[i].resize(2 * b.ctas);
    CHECK(cudaMemcpy(h[i].data(), b.stamps[i], h[i].size() * 8, cudaMemcpyDeviceToHost));
    sp[i] = span_of(h[i], b.ctas);
  }
  const double t0 = std::min(sp[0].start, sp[1].start);
  const double overlap = std::max(0.0, std::min(sp[0].end, sp[1].end) - std::max(sp[0].start, sp[1].start));
  const double shorter = std::min(sp[0].end - sp[0].start, sp[1].end - sp[1].start);
  std::printf("| %s | %.1f-%.1f | %.1f-%.1f | %.0f %% |\n", label, (sp[0].start - t0) * 1e-3, (sp[0].end - t0) * 1e-3,
              (sp[1].start - t0) * 1e-3, (sp[1].end - t0) * 1e-3, shorter > 0 ? 100.0 * overlap / shorter : 0.0);
  std::fflush(stdout);
}

void run_case(const std::string& what, Branches b, cudaStream_t caller) {
  CHECK(cudaDeviceSynchronize());
  fork_join(b, caller);  // eager
  CHECK(cudaStreamSynchronize(caller));
  report((what + ", eager").c_str(), b);
  cuda::Graph g;  // a chain of 4 fork/joins; the stamps keep the last one's
  g.begin_capture(caller);
  for (int i = 0; i < 4; ++i) fork_join(b, caller);
  g.end_capture();
  for (int rep = 0; rep < 3; ++rep) g.replay(caller);
  CHECK(cudaStreamSynchronize(caller));
  report((what + ", graph of 4 fork/joins").c_str(), b);
}

__global__ void empty_kernel() {}

// Microseconds per step of a graph of 20 steps, each `step` (median of 20 replays).
template <class Step>
double us_per_step(cudaStream_t caller, Step&& step) {
  constexpr int kSteps = 20;
  cuda::Graph g;
  g.begin_capture(caller);
  for (int i = 0; i < kSteps; ++i) step();
  g.end_capture();
  return 1e3 * median_batch_ms(3, 20, [&] { g.replay(caller); }) / kSteps;
}

// What one step costs in a graph, by the shape of its fork/join (one empty kernel per branch).
void fork_join_costs(cudaStream_t caller, cudaStream_t g0, cudaStream_t g1, cudaStream_t p0, cudaStream_t p1) {
  auto on = [](cudaStream_t s) { empty_kernel<<<1, 32, 0, s>>>(); };
  auto wait = [](cudaStream_t waiter, cudaStream_t on) { cuda::fork_streams(on, {waiter}); };
  // Fork from the caller to `targets`, run `body`, join them back.
  auto around = [&](const std::vector<void*>& targets, const std::function<void()>& body) {
    cuda::fork_streams(caller, targets);
    body();
    cuda::join_streams(caller, targets);
  };
  struct Case {
    const char* name;
    std::function<void()> step;
  };
  const std::vector<Case> cases = {
      {"one kernel on the caller, no fork", [&] { on(caller); }},
      {"caller -> 2 ordinary streams -> caller", [&] { around({p0, p1}, [&] { on(p0); on(p1); }); }},
      {"caller -> green 0 -> caller", [&] { around({g0}, [&] { on(g0); }); }},
      {"caller -> green 0 and 1 -> caller", [&] { around({g0, g1}, [&] { on(g0); on(g1); }); }},
      {"caller -> green 0 and ordinary -> caller", [&] { around({g0, p1}, [&] { on(g0); on(p1); }); }},
      {"caller -> green 0 and 1, join 1 -> 0 -> caller",
       [&] {
         cuda::fork_streams(caller, {g0, g1});
         on(g0);
         on(g1);
         wait(g0, g1);
         cuda::join_streams(caller, {g0});
       }},
      {"caller -> green 0 -> green 1 -> caller (serial)",
       [&] {
         cuda::fork_streams(caller, {g0});
         on(g0);
         wait(g1, g0);
         on(g1);
         cuda::join_streams(caller, {g1});
       }},
      {"kernel on caller and green 1 -> caller", [&] { around({g1}, [&] { on(caller); on(g1); }); }},
      {"caller -> 2 kernels on green 0 -> caller", [&] { around({g0}, [&] { on(g0); on(g0); }); }},
      {"caller -> 2 kernels on each of green 0 and 1 -> caller",
       [&] { around({g0, g1}, [&] { on(g0); on(g0); on(g1); on(g1); }); }},
      {"caller -> 3 kernels on each of green 0 and 1 -> caller",
       [&] { around({g0, g1}, [&] { for (int i = 0; i < 3; ++i) { on(g0); on(g1); } }); }},
  };
  std::printf("\n| one graph step (20 in a chain, empty kernels) | us per step |\n|---|---|\n");
  for (const Case& c : cases) std::printf("| %s | %.2f |\n", c.name, us_per_step(caller, c.step));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string split;
  if (const int rc = bench::split_from_args(argc, argv, "cuda_green_overlap_probe [--split backfill|aligned]", &split))
    return rc;
  std::vector<cuda::SmPartition> parts;
  if (const int rc = bench::make_two_domains(split, &parts)) return rc;
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("partitions (%s): %d + %d SMs; CUDA_DEVICE_MAX_CONNECTIONS=%s\n\n", split.c_str(), parts[0].sm_count,
              parts[1].sm_count, conn ? conn : "(unset)");
  cudaStream_t caller, plain[2];
  CHECK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  for (auto& p : plain) CHECK(cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking));

  const long long bytes = 256ll << 20;  // per branch, > 4x L2 together
  Branches b{};
  b.n16 = bytes / 16;
  for (int i = 0; i < 2; ++i) {
    CHECK(cudaMalloc(&b.stamps[i], 2 * 1024 * 8));
    void* src = nullptr;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMemset(src, i + 1, bytes));
    b.src[i] = static_cast<const uint4*>(src);
  }
  CHECK(cudaMalloc(&b.sink, sizeof(int)));

  std::printf("| scenario | branch 0 us | branch 1 us | overlap of the shorter |\n|---|---|---|---|\n");
  for (int green = 1; green >= 0; --green) {
    for (int i = 0; i < 2; ++i) b.stream[i] = static_cast<cudaStream_t>(green ? parts[i].stream : plain[i]);
    const std::string streams = green ? "green" : "ordinary";
    const int ctas = green ? parts[0].sm_count : 66;
    for (long long spin : {20000ll, 0ll}) {
      b.spin_ns = spin;
      b.ctas = spin > 0 ? ctas : 2 * ctas;
      run_case(streams + (spin > 0 ? ", spin 20 us, " : ", read 256 MB, ") + std::to_string(b.ctas) + " CTAs", b, caller);
    }
  }
  fork_join_costs(caller, static_cast<cudaStream_t>(parts[0].stream), static_cast<cudaStream_t>(parts[1].stream), plain[0],
                  plain[1]);
  for (auto& p : plain) cudaStreamDestroy(p);
  cuda::destroy_sm_partitions(parts);
  return 0;
}
