// Where the time of the NVFP4 matrix-vector kernel goes (nvfp4_gemv.h): a timeline of its CTAs in
// the one-weight launch and in the partitioned op's domain-aware launch over 2 emulated domains.
//
// For each N x K and M it captures a graph of R back-to-back launches over R rotating weights
// (> 240 MB), times it (median of replays), then replays it once more with the CTAs stamping
// %globaltimer (Nvfp4GemvArgs::trace) and prints medians over the inner launches, in us from each
// launch's first CTA start: spread (the last CTA's start), waited (its wait for the previous
// kernel returned), unit (its first block known; domain-aware: the counters' answer), body (its
// last block's outputs written), exit (it left; domain-aware: after the counters' refusals), each
// as the median and the last over the CTAs; next (the next launch's first CTA start) and gap
// (next minus the last exit). With programmatic dependent launch a launch's CTAs start while the
// previous launch runs, so "waited" is when the previous launch ended and "next" what a call costs.
// usage: cuda_gemv_timeline_bench [--m M1,M2,..] [--shape NxK]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/nvfp4_gemv.h"
#include "core/tensor.h"
#include "cta_timeline.h"
#include "graph_timing.h"
#include "nvfp4_bench_weights.h"

using namespace locus;
using namespace locus::bench;
namespace cd = locus::cuda::detail;

int main(int argc, char** argv) {
  std::string m_list = "1,8,16", only_shape;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--m" && i + 1 < argc) m_list = argv[++i];
    else if (a == "--shape" && i + 1 < argc) only_shape = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument '%s'\nusage: cuda_gemv_timeline_bench [--m M1,M2,..] [--shape NxK]\n",
                   a.c_str());
      return 2;
    }
  }
  std::vector<int64_t> ms;
  Shapes shapes;  // the shards need N / 2 in whole 128-row tiles
  if (!parse_m_list(m_list, cd::kNvfp4GemvMaxM, &ms) || !parse_shapes(only_shape, 256, 64, &shapes)) return 2;
  std::vector<cuda::SmPartition> parts;
  if (const int rc = make_two_domains("backfill", &parts)) return rc;
  const Device dev = Device::cuda(0);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy_bw = copy_bandwidth(s);
  std::mt19937_64 rng(17);
  CtaTraceBuffer traced(32 * 1024, cd::kGemvTraceWords);  // R launches x their CTAs: at most about 7000 at these shapes

  std::printf("Device copy bandwidth (read + written): %.0f GB/s; domains %d + %d SMs\n\n", copy_bw * 1e-9,
              parts[0].sm_count, parts[1].sm_count);
  std::printf("| N x K | M | launch | CTAs | us per call | floor us | spread | waited (med / last) | unit (med / last) | "
              "body (med / last) | exit (med / last) | next | gap |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [N, K] : shapes) {
    const double wbytes = double(N) * K * 0.5625;  // e2m1 codes + e4m3 block scales
    const int R = rotating_copies(wbytes, 32);
    const ops::Nvfp4Weight host = random_fp4_host(N, K, rng);
    const ops::Nvfp4Weight base = cuda::nvfp4_prepare(host, 0, -1);
    const ops::Nvfp4Weight base0 = cuda::nvfp4_prepare(half_rows(host, 0), 0, 0);
    const ops::Nvfp4Weight base1 = cuda::nvfp4_prepare(half_rows(host, 1), 0, 1);
    std::vector<ops::Nvfp4Weight> w(R);
    std::vector<std::vector<ops::Nvfp4Weight>> shards(R);
    for (int r = 0; r < R; ++r) {
      w[r] = cuda::nvfp4_clone(base, -1);
      shards[r] = {cuda::nvfp4_clone(base0, 0), cuda::nvfp4_clone(base1, 1)};
    }
    const std::vector<cuda::DomainSlice> slices = {{0, N / 2, parts[0].stream}, {N / 2, N, parts[1].stream}};
    for (int64_t M : ms) {
      Tensor x = Tensor::empty({M, K}, DType::kBF16, dev), y = Tensor::empty({M, N}, DType::kBF16, dev);
      fill_random_bf16(x, rng);
      // The two launches of launch r, traced into `t` (off: a null buffer).
      const std::pair<const char*, std::function<void(int, const cd::CtaTrace&)>> launches[] = {
          {"one weight",
           [&](int r, const cd::CtaTrace& t) {
             cd::Nvfp4GemvArgs a = cd::nvfp4_gemv_args(x, w[r], Tensor(), y, false);
             a.trace = t;
             cd::launch_nvfp4_gemv(a, s);
           }},
          {"domain-aware", [&](int r, const cd::CtaTrace& t) {
             cd::Nvfp4GemvDomainArgs a;
             if (!cd::nvfp4_gemv_domain_args(x, shards[r], Tensor(), y, false, slices, &a)) {
               std::fprintf(stderr, "the domain-aware launch does not take %lldx%lld\n", (long long)N, (long long)K);
               std::exit(1);
             }
             a.common.trace = t;
             cd::launch_nvfp4_gemv_domains(a, s);
           }}};
      for (const auto& [name, launch] : launches) {
        const double t = time_graph(capture(s, [&] { for (int r = 0; r < R; ++r) launch(r, {}); }), s, R, 30);
        const cuda::Graph g = capture(s, [&] { for (int r = 0; r < R; ++r) launch(r, traced.trace()); });
        const std::vector<TracedLaunch> tl = traced.replay(g, s, R);
        if (tl.empty() || tl[0].at[0].empty()) {
          std::fprintf(stderr, "%lldx%lld M=%lld %s: no CTA was traced\n", (long long)N, (long long)K, (long long)M, name);
          continue;
        }
        const InnerMedians med{tl};
        const double next = med.next();
        std::printf("| %lld x %lld | %lld | %s | %zu | %.1f | %.1f | %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | "
                    "%.2f / %.2f | %.2f | %.2f |\n",
                    (long long)N, (long long)K, (long long)M, name, tl[0].at[0].size(), t * 1e6, wbytes / copy_bw * 1e6,
                    med.last(cd::kGemvTraceStart), med.at(cd::kGemvTraceWaited), med.last(cd::kGemvTraceWaited),
                    med.at(cd::kGemvTraceUnit), med.last(cd::kGemvTraceUnit), med.at(cd::kGemvTraceBody),
                    med.last(cd::kGemvTraceBody),
                    med.at(cd::kGemvTraceExit), med.last(cd::kGemvTraceExit), next, next - med.last(cd::kGemvTraceExit));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
