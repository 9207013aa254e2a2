// Where the time of the streaming NVFP4 GEMM at decode M goes: a timeline of the streaming
// kernel's CTAs (stream_gemm.h). ops::nvfp4_gemm at M <= 16 times it against the matrix-vector
// kernel (nvfp4_gemv.h); here that kernel is switched off.
//
// For each N x K (DeepSeek-V3's) and M it captures a graph of R back-to-back cuda::nvfp4_gemm
// calls over R rotating weights (> 240 MB, as cuda_gemm_bench does), times it (median of replays),
// then replays it once more with the kernel stamping %globaltimer per CTA
// (StreamGemmTuning::trace) and prints medians over the inner launches (the first follows other
// work, the last has no next), in us from each launch's first CTA start:
//   spread    the last CTA's start;
//   waited    when a CTA's wait for the previous kernel returned (median);
//   first     when warp 0's first chunk landed (median and last over the CTAs);
//   streamed  when the CTA's warps had streamed their unit (median and last);
//   end       when its outputs or partials were written (median and last: the launch's span);
//   next      the next launch's first CTA start (the period; minus the last end: the gap).
// "floor us" is the weight's bytes (codes and scales) at the measured device copy bandwidth (bytes
// read + written per second, as cuda_gemm_bench reports it): about what a pure stream of the
// weight would take.
// usage: cuda_stream_timeline_bench [--m M1,M2,..] [--shape NxK] [--tuning U,W[,S[,P[,F[,T]]]]]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/stream_gemm.h"
#include "core/tensor.h"
#include "cta_timeline.h"
#include "graph_timing.h"
#include "nvfp4_bench_weights.h"
#include "tuning_args.h"

using namespace locus;
using namespace locus::bench;
namespace cd = locus::cuda::detail;

int main(int argc, char** argv) {
  std::string m_list = "1,8,16", only_shape;
  cuda::set_nvfp4_gemv_enabled(false);  // the op below: the streaming kernel
  cd::StreamGemmTuning knobs{};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--m" && i + 1 < argc) m_list = argv[++i];
    else if (a == "--shape" && i + 1 < argc) only_shape = argv[++i];
    else if (a == "--tuning" && i + 1 < argc) {
      if (!parse_stream_tuning(argv[++i], &knobs)) return 2;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\nusage: cuda_stream_timeline_bench [--m M1,M2,..] [--shape NxK] [--tuning %s]\n",
                   a.c_str(), kStreamTuningHelp);
      return 2;
    }
  }
  std::vector<int64_t> ms;
  Shapes shapes;  // the kernel takes K in 16s
  if (!parse_m_list(m_list, cd::kStreamGemmMaxM, &ms) || !parse_shapes(only_shape, 1, 16, &shapes)) return 2;
  if (!cuda::device_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const Device dev = Device::cuda(0);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_bandwidth(s);
  std::mt19937_64 rng(13);
  cd::set_stream_gemm_tuning(knobs);
  CtaTraceBuffer traced(16 * 8 * 132, cd::kStreamTraceWords);  // R <= 16 launches of at most 8 CTAs per SM

  std::printf("Device copy bandwidth (read + written): %.0f GB/s\n\n", copy_bw * 1e-9);
  std::printf("| N x K | M | CTAs | us per call | floor us | GB/s | spread | waited | first (med / last) | "
              "streamed (med / last) | end (med / last) | next | gap |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [N, K] : shapes) {
    const double wbytes = double(N) * K / 2 + double(N) * K / 16;  // e2m1 codes + e4m3 block scales
    const int R = rotating_copies(wbytes);
    const ops::Nvfp4Weight base = cuda::nvfp4_prepare(random_fp4_host(N, K, rng), 0, -1);
    std::vector<ops::Nvfp4Weight> w(R);
    for (int r = 0; r < R; ++r) w[r] = cuda::nvfp4_clone(base, -1);
    for (int64_t M : ms) {
      Tensor x = Tensor::empty({M, K}, DType::kBF16, dev), y = Tensor::empty({M, N}, DType::kBF16, dev);
      fill_random_bf16(x, rng);
      auto one = [&](int r) { cuda::nvfp4_gemm(x, w[r], {}, y, s); };
      const double t = time_graph(capture(s, [&] { for (int r = 0; r < R; ++r) one(r); }), s, R, 30);

      cd::StreamGemmTuning tuning = knobs;
      tuning.trace = traced.trace();
      cd::set_stream_gemm_tuning(tuning);
      const cuda::Graph g = capture(s, [&] { for (int r = 0; r < R; ++r) one(r); });
      cd::set_stream_gemm_tuning(knobs);
      const std::vector<TracedLaunch> launches = traced.replay(g, s, R);
      if (launches.empty() || launches[0].at[0].empty()) {
        std::fprintf(stderr, "%lldx%lld M=%lld: no CTA was traced (not the streaming kernel?)\n", (long long)N,
                     (long long)K, (long long)M);
        continue;
      }
      const InnerMedians med{launches};
      const double next = med.next();
      std::printf("| %lld x %lld | %lld | %zu | %.1f | %.1f | %.0f | %.2f | %.2f | %.2f / %.2f | %.2f / %.2f | "
                  "%.2f / %.2f | %.2f | %.2f |\n",
                  (long long)N, (long long)K, (long long)M, launches[0].at[0].size(), t * 1e6, wbytes / copy_bw * 1e6,
                  wbytes / t * 1e-9, med.last(cd::kStreamTraceStart), med.at(cd::kStreamTraceWaited),
                  med.at(cd::kStreamTraceFirst), med.last(cd::kStreamTraceFirst), med.at(cd::kStreamTraceStreamed),
                  med.last(cd::kStreamTraceStreamed), med.at(cd::kStreamTraceEnd), med.last(cd::kStreamTraceEnd), next,
                  next - med.last(cd::kStreamTraceEnd));
      std::fflush(stdout);
    }
  }
  return 0;
}
