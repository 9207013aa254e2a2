// Where the time of the TMA-fed BMM kernel (bmm_tma.h) goes: a timeline of its CTAs.
//
// For MLA's two absorbed products (H = 128 heads, N x K = 512 x 128 and 128 x 512) and each M, it
// captures a graph of R back-to-back calls over R rotating weights (> 240 MB, as cuda_gemm_bench
// does), unpartitioned (one domain) and partitioned (two emulated domains, one launch), and times
// it (median of replays; plain cuBLAS's strided batched GEMM alongside, as the reference). Then it
// replays each graph once more with the kernel stamping %globaltimer per CTA (BmmTmaTuning::trace)
// and prints medians over the inner launches (the first follows other work, the last has no
// next), in us from each launch's first CTA start:
//   spread  the last CTA's start (how long the launch took to get all its CTAs running);
//   waited  when the producer's wait for the previous kernel returned;
//   go      when the producer knew its units (= waited; with two domains, after the rank claim);
//   first   when a consumer group's first weight slot landed (median and last over the CTAs);
//   end     when a CTA's outputs were written (median and last: the launch's span);
//   next    when the next launch's first CTA started (the period; minus the span: the gap).
// usage: cuda_bmm_timeline_bench [--m M1,M2,..] [--split backfill|aligned] [--bmm-tuning S,R,P,L,C,E,B]
// (--bmm-tuning: the kernel's knobs, as in cuda_gemm_bench)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/bmm_tma.h"
#include "backends/cuda/cuda_ops.h"
#include "core/tensor.h"
#include "cta_timeline.h"
#include "graph_timing.h"
#include "mla_bmm_reference.h"
#include "tuning_args.h"

using namespace locus;
using namespace locus::bench;
namespace cd = locus::cuda::detail;

namespace {

// Per CTA of a launch: the earlier of its two consumer groups' first slots, the later of their ends.
std::vector<double> first_slot(const TracedLaunch& l) {
  std::vector<double> v(l.at[cd::kTraceFirst0].size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::min(l.at[cd::kTraceFirst0][i], l.at[cd::kTraceFirst1][i]);
  return v;
}
std::vector<double> outputs_written(const TracedLaunch& l) {
  std::vector<double> v(l.at[cd::kTraceEnd0].size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::max(l.at[cd::kTraceEnd0][i], l.at[cd::kTraceEnd1][i]);
  return v;
}
double last(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  std::string split = "backfill", m_list = "1,16,64";
  cd::BmmTmaTuning knobs{};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--m" && i + 1 < argc) m_list = argv[++i];
    else if (a == "--split" && i + 1 < argc) split = argv[++i];
    else if (a == "--bmm-tuning" && i + 1 < argc) {
      if (!parse_bmm_tuning(argv[++i], &knobs)) return 2;
    }
    else {
      std::fprintf(stderr,
                   "unknown argument '%s'\nusage: cuda_bmm_timeline_bench [--m M1,M2,..] [--split backfill|aligned] "
                   "[--bmm-tuning %s]\n",
                   a.c_str(), kBmmTuningHelp);
      return 2;
    }
  }
  std::vector<int64_t> ms;
  if (!parse_m_list(m_list, cd::kBmmTmaMaxM, &ms)) return 2;
  std::vector<cuda::SmPartition> parts;
  if (const int rc = make_two_domains(split, &parts)) return rc;
  const Device dev = Device::cuda(0);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t cub;
  cublasCreate(&cub);
  cublasSetStream(cub, s);
  std::mt19937_64 rng(11);
  cd::set_bmm_tma_tuning(knobs);

  CtaTraceBuffer traced(16 * 2 * 1024, cd::kBmmTraceWords);  // R <= 16 launches of at most 2 x 1024 CTAs

  std::printf("| BMM (H x N x K) | M | launch | cuBLAS us | us per call | spread | waited | go | first (med / last) | "
              "end (med / last) | next | gap |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{512, 128}, {128, 512}}) {
    const int64_t H = 128;
    const double wbytes = double(H) * N * K * 2;
    const int R = rotating_copies(wbytes);
    std::vector<Tensor> w(R);
    std::vector<std::vector<Tensor>> shards(R);
    for (int r = 0; r < R; ++r) {
      w[r] = Tensor::empty({H, N, K}, DType::kBF16, dev);
      fill_random_bf16(w[r], rng);
      shards[r] = {w[r].slice(0, 0, H / 2).clone().transpose(1, 2), w[r].slice(0, H / 2, H).clone().transpose(1, 2)};
    }
    const std::vector<cuda::DomainSlice> dslices = {{0, H / 2, parts[0].stream}, {H / 2, H, parts[1].stream}};
    for (int64_t M : ms) {
      Tensor xa = Tensor::empty({M, H, K}, DType::kBF16, dev), ya = Tensor::empty({M, H, N}, DType::kBF16, dev);
      fill_random_bf16(xa, rng);
      Tensor a = xa.transpose(0, 1), y = ya.transpose(0, 1);
      auto cublas = [&](int r) { cublas_mla_bmm(cub, w[r], a, y); };
      auto unpart = [&](int r) { cuda::bmm_tma(a, w[r].transpose(1, 2), y, s); };
      auto part = [&](int r) { cuda::bmm_tma_domains(a, shards[r], y, dslices, s); };
      double t_cublas = 0, t_unpart = 0, t_part = 0;
      InterleavedTimer timer(s);
      timer.add(&t_cublas, R, cublas);
      timer.add(&t_unpart, R, unpart);
      timer.add(&t_part, R, part);
      timer.run(30);

      const std::pair<const char*, double> forms[] = {{"one domain", t_unpart}, {"two domains", t_part}};
      for (int f = 0; f < 2; ++f) {
        cd::BmmTmaTuning tuning = knobs;
        tuning.trace = traced.trace();
        cd::set_bmm_tma_tuning(tuning);
        const cuda::Graph g = capture(s, [&] {
          for (int r = 0; r < R; ++r) f == 0 ? unpart(r) : part(r);
        });
        cd::set_bmm_tma_tuning(knobs);
        const std::vector<TracedLaunch> launches = traced.replay(g, s, R);
        const int n = static_cast<int>(launches[0].at[0].size());
        auto med = [&](const std::function<double(const TracedLaunch&)>& of) { return inner_median(launches, of); };
        const double m[8] = {
            med([](const TracedLaunch& l) { return l.last(cd::kTraceStart); }),
            med([](const TracedLaunch& l) { return l.median(cd::kTraceWaited); }),
            med([](const TracedLaunch& l) { return l.median(cd::kTraceGo); }),
            med([](const TracedLaunch& l) { return median(first_slot(l)); }),
            med([](const TracedLaunch& l) { return last(first_slot(l)); }),
            med([](const TracedLaunch& l) { return median(outputs_written(l)); }),
            med([](const TracedLaunch& l) { return last(outputs_written(l)); }),
            med([](const TracedLaunch& l) { return l.next; })};
        std::printf("| %lld x %lld x %lld | %lld | %s (%d CTAs) | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f / %.2f | "
                    "%.2f / %.2f | %.2f | %.2f |\n",
                    (long long)H, (long long)N, (long long)K, (long long)M, forms[f].first, n, t_cublas * 1e6,
                    forms[f].second * 1e6, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[7] - m[6]);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
