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
// usage: cuda_bmm_timeline_bench [--m M1,M2,..] [--split backfill|aligned] [--bmm-tuning S,R,P,L,C,E]
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
#include "bmm_tuning_arg.h"
#include "graph_timing.h"
#include "mla_bmm_reference.h"

using namespace locus;
using namespace locus::bench;
namespace cd = locus::cuda::detail;

namespace {

using Record = std::vector<unsigned long long>;  // kBmmTraceWords words

struct LaunchSummary {
  double spread = 0, waited = 0, go = 0, first_med = 0, first_max = 0, end_med = 0, end_max = 0, next = 0;
};

// The launches of one traced replay: records in start order, `ctas` per launch.
std::vector<LaunchSummary> summarize(const std::vector<Record>& recs, int ctas) {
  std::vector<LaunchSummary> out;
  const int launches = static_cast<int>(recs.size()) / ctas;
  std::vector<double> t0(launches);
  for (int l = 0; l < launches; ++l) {
    unsigned long long s0 = ~0ull;
    for (int i = 0; i < ctas; ++i) s0 = std::min(s0, recs[l * ctas + i][cd::kTraceStart]);
    t0[l] = static_cast<double>(s0);
  }
  for (int l = 0; l < launches; ++l) {
    LaunchSummary ls;
    std::vector<double> waited, go, first, end;
    for (int i = 0; i < ctas; ++i) {
      const Record& r = recs[l * ctas + i];
      auto at = [&](int w) { return (static_cast<double>(r[w]) - t0[l]) * 1e-3; };
      ls.spread = std::max(ls.spread, at(cd::kTraceStart));
      waited.push_back(at(cd::kTraceWaited));
      go.push_back(at(cd::kTraceGo));
      first.push_back(std::min(at(cd::kTraceFirst0), at(cd::kTraceFirst1)));
      end.push_back(std::max(at(cd::kTraceEnd0), at(cd::kTraceEnd1)));
    }
    ls.waited = median(waited);
    ls.go = median(go);
    ls.first_med = median(first);
    ls.first_max = *std::max_element(first.begin(), first.end());
    ls.end_med = median(end);
    ls.end_max = *std::max_element(end.begin(), end.end());
    ls.next = l + 1 < launches ? (t0[l + 1] - t0[l]) * 1e-3 : 0;
    out.push_back(ls);
  }
  return out;
}

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

  const int capacity = 16 * 2 * 1024;  // records: R <= 16 launches of at most 2 x 1024 CTAs
  unsigned long long* trace = nullptr;
  CK(cudaMalloc(reinterpret_cast<void**>(&trace), (cd::kBmmTraceHeader + size_t(capacity) * cd::kBmmTraceWords) * 8));

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
        tuning.trace = trace;
        tuning.trace_records = capacity;
        cd::set_bmm_tma_tuning(tuning);
        const cuda::Graph g = capture(s, [&] {
          for (int r = 0; r < R; ++r) f == 0 ? unpart(r) : part(r);
        });
        cd::set_bmm_tma_tuning(knobs);
        for (int i = 0; i < 3; ++i) g.replay(s);
        CK(cudaMemsetAsync(trace, 0, 8, s));
        g.replay(s);
        CK(cudaStreamSynchronize(s));
        unsigned long long started = 0;
        CK(cudaMemcpy(&started, trace, 8, cudaMemcpyDeviceToHost));
        const int n = static_cast<int>(std::min<unsigned long long>(started, capacity));
        std::vector<unsigned long long> words(size_t(n) * cd::kBmmTraceWords);
        CK(cudaMemcpy(words.data(), trace + cd::kBmmTraceHeader, words.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<Record> recs(n);
        for (int i = 0; i < n; ++i)
          recs[i].assign(words.begin() + size_t(i) * cd::kBmmTraceWords,
                         words.begin() + size_t(i + 1) * cd::kBmmTraceWords);
        const auto launches = summarize(recs, n / R);
        // Medians over the inner launches (the first follows other work, the last has no next).
        std::vector<double> v[8];
        for (size_t l = 1; l + 1 < launches.size(); ++l) {
          const LaunchSummary& x = launches[l];
          const double vals[8] = {x.spread, x.waited, x.go, x.first_med, x.first_max, x.end_med, x.end_max, x.next};
          for (int j = 0; j < 8; ++j) v[j].push_back(vals[j]);
        }
        double m[8];
        for (int j = 0; j < 8; ++j) m[j] = median(v[j]);
        std::printf("| %lld x %lld x %lld | %lld | %s (%d CTAs) | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f / %.2f | "
                    "%.2f / %.2f | %.2f | %.2f |\n",
                    (long long)H, (long long)N, (long long)K, (long long)M, forms[f].first, n / R, t_cublas * 1e6,
                    forms[f].second * 1e6, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[7] - m[6]);
        std::fflush(stdout);
      }
    }
  }
  cudaFree(trace);
  return 0;
}
