// Device benchmark of the CUDA GEMMs at DeepSeek-V3 shapes (own main, CUDA-event timing).
//
// For every N x K and M it times, as CUDA graphs of R back-to-back calls over R rotating weight
// copies (R chosen so the weights total > 240 MB, four times the H200's L2), the median over
// many replays (the columns' graphs replayed in turn, so drift reaches all alike) of:
//   cublas   plain cuBLAS cublasGemmEx (default algorithm), the reference;
//   lt       cuBLASLt with the tactic timed once per shape (the large-M path of cuda::gemm);
//   stream   our weight-streaming kernel (M <= 32);
//   gemv     our BF16 matrix-vector kernel (bf16_gemv.h, M <= 4);
//   ours     cuda::gemm, the unpartitioned op (stream for M <= stream_gemm_bf16_max_m, else lt or,
//            at M <= 4, the faster of lt and gemv, timed once per shape);
//   part     ops::gemm_partitioned over 2 emulated locality domains (green-context SM
//            partitions, one shard each in its domain's memory): a fork/join of one cuBLASLt call
//            per partition stream (one domain-aware streaming launch instead for M <=
//            LOCUS_STREAM_GEMM_BF16_MAX_M, 0 by default; at M <= 4 the faster, timed once, of
//            that fork/join and the matrix-vector kernel's domain-aware launch);
//   gemv part  that domain-aware launch alone (bf16_gemv.h, M <= 4);
//   fork/join part  the fork/join alone (M <= 4);
//   fp4      ops::nvfp4_gemm (the streaming kernel, or the wgmma kernel where nvfp4_use_wgmma
//            says so, up to M = 64, at M <= 16 the faster, timed once, of the streaming kernel
//            and the NVFP4 matrix-vector kernel; dequantize + cuBLASLt above);
//   fp4 stream  the streaming kernel alone (M <= 16);
//   fp4 gemv  the NVFP4 matrix-vector kernel alone (nvfp4_gemv.h, M <= 16);
//   fp4 mma  the same through the streaming (mma.sync) kernel, where fp4 takes the wgmma one;
//   fp4part  ops::nvfp4_gemm_partitioned over the 2 domains (M <= 64): one domain-aware launch
//            of the streaming kernel (at M <= 16 the faster, timed once, of that, a fork/join
//            of per-partition nvfp4_gemm calls and the matrix-vector kernel's domain-aware launch);
//   fp4part launch / fork/join / gemv launch  those three alone (M <= 16).
// The BMM rows (MLA's absorbed products, H = 128) time plain cuBLAS (strided batched), the op
// (cuda::bmm: cuBLASLt), the TMA-fed kernel (bmm_tma.h, M <= 64) with [N, K] and with [K, N]
// weights, ops::bmm_partitioned over the 2 domains (the faster, timed once, of the kernel's
// domain-aware launch and a fork/join of cuBLASLt calls), that launch alone (with [N, K] and with
// [K, N] shards: MLA runs k_b, the 512 x 128 product, in [K, N]; v_b, 128 x 512, in [N, K]) and
// that fork/join alone.
// It prints ratios, achieved GB/s and the measured copy bandwidth. --sweep first times the
// streaming kernels at M = 1, 16 and 32 under each work decomposition and CTA shape.
//
// --gemv-sweep first times the NVFP4 matrix-vector kernel at M = 1, 8 and 16 in each block shape.
//
// usage: cuda_gemm_bench [--copy-bandwidth] [--split backfill|aligned] [--quick] [--sweep] [--gemv-sweep] [--shape NxK]
//                        [--bmm] [--bmm-tuning S,R,P,L,C,E,B] [--m M1,M2,..] [--tuning U,W[,S[,P[,F[,T]]]]] [--out FILE]
// (--copy-bandwidth: print the device line with the copy bandwidth, and stop. --shape: only that
// N x K, in the sweep and the table; the BMM rows are skipped. --bmm: only the BMM rows.
// --bmm-tuning: the TMA BMM's units per head, ring slots, dependent launch, L2 fetch size, CTAs
// per SM, early weight copies and room for the next launch, as in BmmTmaTuning (0 = the default
// for the first two). --m: the M values of the table and the BMM rows. --tuning: the streaming
// kernel's units per CTA, warps per CTA, ring depth, dependent launch (1/0), KB asked of L2
// before the previous kernel ends, feed (0 cp.async rings, 1 TMA producer), for the table, as in
// StreamGemmTuning; fields left out keep their defaults)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/bf16_gemm.h"
#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/bmm_tma.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/domain_table.h"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/nvfp4_wgmma.h"
#include "backends/cuda/stream_gemm.h"
#include "core/float_convert.h"
#include "core/tensor.h"
#include "ops/nvfp4.h"
#include "ops/partitioned.h"
#include "graph_timing.h"
#include "mla_bmm_reference.h"
#include "nvfp4_bench_weights.h"
#include "tuning_args.h"

using namespace locus;
using namespace locus::bench;

namespace {

struct Row {
  int64_t n, k, m;
  double cublas = 0, lt = 0, stream = 0, gemv = 0, ours = 0, part = 0, gemvpart = 0, forkjoinpart = 0, fp4 = 0, fp4stream = 0,
         fp4gemv = 0, fp4mma = 0, fp4part = 0, fp4partlaunch = 0, fp4partfj = 0, fp4partgemv = 0;
};

// The NVFP4 matrix-vector kernel's arguments for y = x w^T (w prepared for CUDA).
cuda::detail::Nvfp4GemvArgs fp4_gemv_args(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& y) {
  return cuda::detail::nvfp4_gemv_args(x, w, Tensor(), y, false);
}

// The matrix-vector kernel's arguments for y = x w^T (dense operands).
cuda::detail::Bf16GemvArgs gemv_args(const Tensor& x, const Tensor& w, const Tensor& y) {
  cuda::detail::Bf16GemvArgs a;
  a.x = x.data_ptr();
  a.x_ld = x.stride(0);
  a.w = w.data_ptr();
  a.w_ld = w.stride(0);
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.m = x.size(0);
  a.n = w.size(0);
  a.k = x.size(1);
  return a;
}

// The domain-aware launch's arguments for y = x [s0; s1]^T, shard d on partition stream d.
cuda::detail::Bf16GemvDomainArgs gemv_domain_args(const Tensor& x, const Tensor& s0, const Tensor& s1, const Tensor& y,
                                                  const std::vector<void*>& streams) {
  cuda::detail::Bf16GemvDomainArgs a;
  a.common = gemv_args(x, s0, y);
  a.num_domains = 2;
  a.sm_domain = cuda::detail::sm_domain_table(streams);
  a.parts[0] = {s0.data_ptr(), s0.stride(0), s0.size(0), 0, 0};
  a.parts[1] = {s1.data_ptr(), s1.stride(0), s1.size(0), s0.size(0), 1};
  a.num_parts = 2;
  return a;
}

// Microseconds with one decimal, or "-" for a column not measured.
std::string us(double seconds) {
  if (seconds <= 0) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", seconds * 1e6);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string split = "backfill", out_path, only_shape, tuning_arg, m_list, bmm_tuning_arg;
  bool quick = false, sweep = false, gemv_sweep = false, bmm_only = false, bandwidth_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--split" && i + 1 < argc) split = argv[++i];
    else if (a == "--quick") quick = true;
    else if (a == "--copy-bandwidth") bandwidth_only = true;
    else if (a == "--sweep") sweep = true;
    else if (a == "--gemv-sweep") gemv_sweep = true;
    else if (a == "--bmm") bmm_only = true;
    else if (a == "--bmm-tuning" && i + 1 < argc) bmm_tuning_arg = argv[++i];
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--shape" && i + 1 < argc) only_shape = argv[++i];
    else if (a == "--tuning" && i + 1 < argc) tuning_arg = argv[++i];
    else if (a == "--m" && i + 1 < argc) m_list = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument '%s'\nusage: cuda_gemm_bench [--copy-bandwidth] [--split backfill|aligned] [--quick] [--sweep] [--gemv-sweep] [--shape NxK] [--bmm] [--bmm-tuning S,R,P,L,C,E,B] [--m M1,M2,..] [--tuning U,W[,S[,P[,F[,T]]]]] [--out FILE]\n",
                   a.c_str());
      return 2;
    }
  }
  std::vector<cuda::SmPartition> parts;
  if (const int rc = make_two_domains(split, &parts)) return rc;
  const auto info = cuda::query_device(0);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<void*> pstreams = {parts[0].stream, parts[1].stream};
  cublasHandle_t cub;
  cublasCreate(&cub);
  void* cub_ws;
  CK(cudaMalloc(&cub_ws, 32 << 20));
  cublasSetWorkspace(cub, cub_ws, 32 << 20);
  cublasSetStream(cub, s);

  // The wgmma kernel's M rule in force (LOCUS_NVFP4_WGMMA_MIN_M), restored after each
  // streaming-kernel column.
  const int wgmma_forced = cuda::detail::nvfp4_wgmma_forced_min_m();
  const double bw = copy_bandwidth(s);
  std::printf("device: %s, %d SMs, L2 %d MB; partitions (%s): %d + %d SMs; copy bandwidth %.0f GB/s\n",
              info.name.c_str(), info.sm_count, info.l2_bytes >> 20, split.c_str(), parts[0].sm_count, parts[1].sm_count,
              bw * 1e-9);
  if (bandwidth_only) return 0;

  Shapes shapes = deepseek_v3_shapes();
  std::vector<std::pair<int64_t, int64_t>> sweep_shapes = {{7168, 7168}, {18432, 7168}, {4096, 7168},
                                                           {24576, 1536}, {32768, 512}, {7168, 2048}};
  std::vector<int64_t> ms = {1, 8, 16, 32, 64, 128, 512, 4096};
  if (quick) {
    shapes = {{7168, 7168}, {18432, 7168}, {7168, 2048}};
    ms = {1, 16, 32, 512};
  }
  // The table's M values instead of the defaults.
  if (!m_list.empty() && !parse_m_list(m_list, INT64_MAX, &ms)) return 2;
  if (!only_shape.empty()) {
    if (!parse_shapes(only_shape, 16, 16, &shapes)) return 2;
    sweep_shapes = shapes;
  }
  if (bmm_only) shapes.clear();

  cuda::detail::BmmTmaTuning bmm_tuning{};
  if (!bmm_tuning_arg.empty() && !parse_bmm_tuning(bmm_tuning_arg, &bmm_tuning)) return 2;
  cuda::detail::set_bmm_tma_tuning(bmm_tuning);
  cuda::detail::StreamGemmTuning table_tuning{};
  if (!tuning_arg.empty() && !parse_stream_tuning(tuning_arg, &table_tuning)) return 2;

  if (gemv_sweep) {
    // The NVFP4 matrix-vector kernel in each block shape, beside the streaming kernel.
    std::mt19937_64 srng(11);
    const std::vector<cuda::detail::Nvfp4GemvShape> gemv_shapes = {
        {1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 1}, {2, 2}, {2, 4}, {2, 8}, {1, 1, true}, {1, 2, true}, {1, 4, true}, {1, 8, true}};
    std::printf("\nNVFP4 matrix-vector kernel sweep (us per call; tTwW: T tiles a warp, W warps a slot, L: the lean form "
                "(9-16 tokens only); heur: the built-in shape; stream: the streaming kernel)\n%-22s %7s %7s",
                "shape", "stream", "heur");
    for (const auto& g : gemv_shapes) std::printf("   t%dw%d%s", g.tiles_per_warp, g.warps_per_slot, g.lean ? "L" : " ");
    std::printf("\n");
    for (auto [N, K] : shapes) {
      const int R = rotating_copies(double(N) * K * 0.5625, 32);
      std::vector<ops::Nvfp4Weight> f(R);
      ops::Nvfp4Weight fbase = cuda::nvfp4_prepare(random_fp4_host(N, K, srng), 0, -1);
      for (int r = 0; r < R; ++r) f[r] = cuda::nvfp4_clone(fbase, -1);
      for (int64_t M : {1, 8, 16}) {
        Tensor x = Tensor::empty({M, K}, DType::kBF16, Device::cuda(0));
        fill_random_bf16(x, srng);
        Tensor y = Tensor::empty({M, N}, DType::kBF16, Device::cuda(0));
        std::printf("%5lldx%-5lld M=%-3lld    ", (long long)N, (long long)K, (long long)M);
        auto time_calls = [&](const std::function<void(int)>& call) {
          auto g = capture(s, [&] {
            for (int r = 0; r < R; ++r) call(r);
          });
          return time_graph(g, s, R, 20) * 1e6;
        };
        cuda::set_nvfp4_gemv_enabled(false);
        std::printf(" %7.1f", time_calls([&](int r) { cuda::nvfp4_gemm(x, f[r], {}, y, s); }));
        cuda::set_nvfp4_gemv_enabled(true);
        std::printf(" %7.1f", time_calls([&](int r) { cuda::detail::launch_nvfp4_gemv(fp4_gemv_args(x, f[r], y), s); }));
        for (const auto& shape : gemv_shapes) {
          if (shape.lean && M <= 8) {
            std::printf(" %7s", "-");
            continue;
          }
          cuda::detail::set_nvfp4_gemv_shape(shape);
          std::printf(" %7.1f",
                      time_calls([&](int r) { cuda::detail::launch_nvfp4_gemv(fp4_gemv_args(x, f[r], y), s); }));
        }
        cuda::detail::set_nvfp4_gemv_shape({0, 0});
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }

  if (sweep) {
    cuda::set_nvfp4_gemv_enabled(false);  // nvfp4_gemm below: the streaming kernel
    // The streaming kernel's stream-K cut: units per resident CTA.
    std::mt19937_64 srng(7);
    std::printf("\nsplit sweep (us per call; columns: heuristic; whole rows, stream-K with 1 and 2 units per resident CTA "
                "(CTA shape by the heuristic); 4- and 8-warp CTAs (decomposition by the heuristic); the heuristic without "
                "programmatic dependent launch; the TMA feed (NVFP4 at M <= 16, else as heur) by its heuristic, whole rows, "
                "stream-K 2 and with 16 consumer warps)\n%-22s", "shape");
    // {units per CTA, warps}: the heuristic; whole rows; stream-K 1 and 2 per CTA; 4 and 8 warps.
    // Then: the heuristic launched in plain stream order (no programmatic dependent launch); the
    // TMA feed (8 consumer warps, then 16).
    const std::vector<cuda::detail::StreamGemmTuning> tunings = {
        {0, 0}, {-1, 0}, {1, 0}, {2, 0}, {0, 4}, {0, 8}, {0, 0, 0, 0}, {0, 0, 0, 1, 0, 1}, {-1, 0, 0, 1, 0, 1},
        {2, 0, 0, 1, 0, 1}, {0, 16, 0, 1, 0, 1}};
    for (const char* h : {"heur", "rows", "sk1", "sk2", "w4", "w8", "plain", "tma", "tmarows", "tmask2", "tma16"})
      std::printf(" %7s", h);
    std::printf("\n");
    for (auto [N, K] : sweep_shapes) {
      const int R = rotating_copies(double(N) * K * 2);
      std::vector<Tensor> w(R);
      std::vector<ops::Nvfp4Weight> f(R);
      ops::Nvfp4Weight fbase = cuda::nvfp4_prepare(random_fp4_host(N, K, srng), 0, -1);
      for (int r = 0; r < R; ++r) {
        w[r] = Tensor::empty({N, K}, DType::kBF16, Device::cuda(0));
        fill_random_bf16(w[r], srng);
        f[r] = cuda::nvfp4_clone(fbase, -1);
      }
      for (int64_t M : {1, 16, 32}) {
        Tensor x = Tensor::empty({M, K}, DType::kBF16, Device::cuda(0));
        fill_random_bf16(x, srng);
        Tensor y = Tensor::empty({M, N}, DType::kBF16, Device::cuda(0));
        for (int fp4 = 0; fp4 < 2; ++fp4) {
          std::printf("%-5s %5lldx%-5lld M=%-3lld", fp4 ? "nvfp4" : "bf16", (long long)N, (long long)K, (long long)M);
          for (const auto& tuning : tunings) {
            cuda::detail::set_stream_gemm_tuning(tuning);
            auto g = capture(s, [&] {
              for (int r = 0; r < R; ++r) {
                if (fp4) cuda::nvfp4_gemm(x, f[r], {}, y, s);
                else cuda::stream_gemm(x, w[r], {}, y, false, s);
              }
            });
            std::printf(" %7.1f", time_graph(g, s, R, 20) * 1e6);
          }
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
    cuda::set_nvfp4_gemv_enabled(true);
  }
  cuda::detail::set_stream_gemm_tuning(table_tuning);

  std::mt19937_64 rng(12345);
  std::vector<Row> rows;
  const Device dev = Device::cuda(0);
  const Stream caller{dev, s};
  const std::vector<ops::PartitionSlice> no_slices;
  for (auto [N, K] : shapes) {
    const double wbytes = double(N) * K * 2;
    const int R = rotating_copies(wbytes);
    std::vector<Tensor> w(R), sh0(R), sh1(R);
    for (int r = 0; r < R; ++r) {
      w[r] = Tensor::empty({N, K}, DType::kBF16, dev);
      fill_random_bf16(w[r], rng);
      sh0[r] = w[r].slice(0, 0, N / 2).clone();  // per-domain shard copies
      sh1[r] = w[r].slice(0, N / 2, N).clone();
    }
    const std::vector<ops::PartitionSlice> slices = {{0, N / 2, Stream{dev, parts[0].stream}},
                                                     {N / 2, N, Stream{dev, parts[1].stream}}};
    // NVFP4: one random weight prepared, then device copies for rotation.
    const double fbytes = double(N) * K * 0.5625;
    const int RF = rotating_copies(fbytes, 32);
    ops::Nvfp4Weight host_fp4 = random_fp4_host(N, K, rng);
    ops::Nvfp4Weight base = cuda::nvfp4_prepare(host_fp4, 0, -1);
    ops::Nvfp4Weight base0 = cuda::nvfp4_prepare(half_rows(host_fp4, 0), 0, 0);
    ops::Nvfp4Weight base1 = cuda::nvfp4_prepare(half_rows(host_fp4, 1), 0, 1);
    std::vector<ops::Nvfp4Weight> f(RF);
    std::vector<std::vector<ops::Nvfp4Weight>> fsh(RF);
    for (int r = 0; r < RF; ++r) {
      f[r] = cuda::nvfp4_clone(base, -1);
      fsh[r] = {cuda::nvfp4_clone(base0, 0), cuda::nvfp4_clone(base1, 1)};
    }
    for (int64_t M : ms) {
      Tensor x = Tensor::empty({M, K}, DType::kBF16, dev);
      fill_random_bf16(x, rng);
      Tensor y = Tensor::empty({M, N}, DType::kBF16, dev);
      Row row{N, K, M};
      const int reps = M >= 512 ? 10 : 30;
      const float alpha = 1.f, beta = 0.f;
      InterleavedTimer timer(s);
      timer.add(&row.cublas, R, [&](int r) {
        cublasGemmEx(cub, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w[r].data_ptr(), CUDA_R_16BF, K, x.data_ptr(),
                     CUDA_R_16BF, K, &beta, y.data_ptr(), CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      });
      cuda::set_bf16_gemv_enabled(false);  // cuBLASLt alone
      timer.add(&row.lt, R, [&](int r) { cuda::detail::bf16_gemm(x, {w[r].data_ptr(), K, N, nullptr}, {}, y, s); });
      cuda::set_bf16_gemv_enabled(true);
      if (M <= cuda::detail::kBf16GemvMaxM)
        timer.add(&row.gemv, R, [&](int r) { cuda::detail::launch_bf16_gemv(gemv_args(x, w[r], y), s); });
      if (M <= cuda::detail::kStreamGemmMaxM)
        timer.add(&row.stream, R, [&](int r) { cuda::stream_gemm(x, w[r], {}, y, false, s); });
      timer.add(&row.ours, R, [&](int r) { cuda::gemm(x, w[r], {}, y, s); });
      timer.add(&row.part, R, [&](int r) { ops::gemm_partitioned(x, {sh0[r], sh1[r]}, {}, y, slices, caller); });
      if (M <= cuda::detail::kBf16GemvMaxM) {
        timer.add(&row.gemvpart, R, [&](int r) {
          cuda::detail::launch_bf16_gemv_domains(gemv_domain_args(x, sh0[r], sh1[r], y, pstreams), s);
        });
        cuda::set_bf16_gemv_domains_enabled(false);
        timer.add(&row.forkjoinpart, R,
                  [&](int r) { ops::gemm_partitioned(x, {sh0[r], sh1[r]}, {}, y, slices, caller); });
        cuda::set_bf16_gemv_domains_enabled(true);
      }
      if (M <= 128) timer.add(&row.fp4, RF, [&](int r) { cuda::nvfp4_gemm(x, f[r], {}, y, s); });
      if (M <= cuda::detail::kNvfp4GemvMaxM) {
        cuda::set_nvfp4_gemv_enabled(false);
        timer.add(&row.fp4stream, RF, [&](int r) { cuda::nvfp4_gemm(x, f[r], {}, y, s); });
        cuda::set_nvfp4_gemv_enabled(true);
        timer.add(&row.fp4gemv, RF,
                  [&](int r) { cuda::detail::launch_nvfp4_gemv(fp4_gemv_args(x, f[r], y), s); });
      }
      if (cuda::detail::nvfp4_use_wgmma(M, K) && M <= cuda::kNvfp4StreamMaxM) {  // the streaming kernel instead
        cuda::detail::set_nvfp4_wgmma_min_m(cuda::kNvfp4StreamMaxM + 1);
        timer.add(&row.fp4mma, RF, [&](int r) { cuda::nvfp4_gemm(x, f[r], {}, y, s); });
        cuda::detail::set_nvfp4_wgmma_min_m(wgmma_forced);
      }
      if (M <= cuda::kNvfp4StreamMaxM)
        timer.add(&row.fp4part, RF, [&](int r) { ops::nvfp4_gemm_partitioned(x, fsh[r], {}, y, slices, caller); });
      if (M <= cuda::detail::kNvfp4GemvMaxM) {
        using cuda::detail::Nvfp4PartitionedPath;
        const std::pair<double*, Nvfp4PartitionedPath> forced[] = {
            {&row.fp4partlaunch, Nvfp4PartitionedPath::kStreamingLaunch},
            {&row.fp4partfj, Nvfp4PartitionedPath::kForkJoin},
            {&row.fp4partgemv, Nvfp4PartitionedPath::kMatrixVectorLaunch}};
        for (const auto& [out, path] : forced) {
          cuda::detail::set_nvfp4_partitioned_path(path);
          cuda::detail::set_nvfp4_gemv_always(true);  // the fork/join's per-partition ops: matrix-vector launches
          timer.add(out, RF, [&](int r) { ops::nvfp4_gemm_partitioned(x, fsh[r], {}, y, slices, caller); });
        }
        cuda::detail::set_nvfp4_gemv_always(false);
        cuda::detail::set_nvfp4_partitioned_path(Nvfp4PartitionedPath::kTimed);
      }
      timer.run(reps);
      rows.push_back(row);
      const double io = double(M) * K * 2 + double(M) * N * 2;
      std::printf("N=%6lld K=%6lld M=%5lld | cublas %8.1f | lt %8.1f | stream %8.1f | gemv %8.1f | ours %8.1f (%.2fx) "
                  "%5.0f GB/s | part %8.1f (unpart/part %.2f) | gemv part %8.1f | fork/join part %8.1f",
                  (long long)N, (long long)K, (long long)M, row.cublas * 1e6, row.lt * 1e6, row.stream * 1e6,
                  row.gemv * 1e6, row.ours * 1e6, row.cublas / row.ours, (wbytes + io) / row.ours * 1e-9, row.part * 1e6,
                  row.ours / row.part, row.gemvpart * 1e6, row.forkjoinpart * 1e6);
      if (row.fp4 > 0)
        std::printf(" | fp4 %7.1f (%.2fx vs cublas) %5.0f GB/s", row.fp4 * 1e6, row.cublas / row.fp4,
                    (fbytes + io) / row.fp4 * 1e-9);
      if (row.fp4gemv > 0)
        std::printf(" | fp4 stream %7.1f | fp4 gemv %7.1f (%.2fx vs cublas)", row.fp4stream * 1e6, row.fp4gemv * 1e6,
                    row.cublas / row.fp4gemv);
      if (row.fp4mma > 0) std::printf(" | fp4 mma.sync %7.1f (%.2fx)", row.fp4mma * 1e6, row.cublas / row.fp4mma);
      if (row.fp4part > 0) std::printf(" | fp4part %7.1f (%.2f)", row.fp4part * 1e6, row.fp4 / row.fp4part);
      if (row.fp4partfj > 0)
        std::printf(" | fp4part launch %7.1f, fork/join %7.1f, gemv launch %7.1f", row.fp4partlaunch * 1e6,
                    row.fp4partfj * 1e6, row.fp4partgemv * 1e6);
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  // MLA absorbed BMMs (H = 128 heads, per-head weights [N, K]): q_nope x W_UK^T and o_lat x W_UV^T.
  std::string bmm_md =
      "\n| BMM (H x N x K) | M | cuBLAS us | ours us | ours/cuBLAS speed | TMA kernel us | TMA [K, N] us | TMA GB/s | "
      "part us | unpart/part | TMA part us | TMA part [K, N] us | fork/join part us |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  const auto bmm_shapes = only_shape.empty() ? std::vector<std::pair<int64_t, int64_t>>{{512, 128}, {128, 512}}
                                             : std::vector<std::pair<int64_t, int64_t>>{};
  for (auto [N, K] : bmm_shapes) {
    const int64_t H = 128;
    const double wbytes = double(H) * N * K * 2;
    const int R = rotating_copies(wbytes);
    std::vector<Tensor> w(R);  // [H, N, K]
    for (int r = 0; r < R; ++r) {
      w[r] = Tensor::empty({H, N, K}, DType::kBF16, dev);
      fill_random_bf16(w[r], rng);
    }
    std::vector<Tensor> w_kn(R);  // weights stored [H, K, N] (MLA's k_b layout)
    std::vector<std::vector<Tensor>> shards(R), shards_kn(R);
    for (int r = 0; r < R; ++r) {
      w_kn[r] = Tensor::empty({H, K, N}, DType::kBF16, dev);
      fill_random_bf16(w_kn[r], rng);
      shards[r] = {w[r].slice(0, 0, H / 2).clone().transpose(1, 2), w[r].slice(0, H / 2, H).clone().transpose(1, 2)};
      shards_kn[r] = {w_kn[r].slice(0, 0, H / 2).clone(), w_kn[r].slice(0, H / 2, H).clone()};
    }
    const std::vector<ops::PartitionSlice> hslices = {{0, H / 2, Stream{dev, parts[0].stream}},
                                                      {H / 2, H, Stream{dev, parts[1].stream}}};
    const std::vector<cuda::DomainSlice> dslices = {{0, H / 2, parts[0].stream}, {H / 2, H, parts[1].stream}};
    const std::vector<int64_t> bmm_ms = !m_list.empty() ? ms : quick ? std::vector<int64_t>{1, 16} : std::vector<int64_t>{1, 8, 16, 32, 64, 128};
    for (int64_t M : bmm_ms) {
      Tensor xa = Tensor::empty({M, H, K}, DType::kBF16, dev), ya = Tensor::empty({M, H, N}, DType::kBF16, dev);
      fill_random_bf16(xa, rng);
      Tensor a = xa.transpose(0, 1), y = ya.transpose(0, 1);  // [H, M, K], [H, M, N] views, as MLA runs them
      InterleavedTimer timer(s);
      double t_cublas = 0, t_ours = 0, t_tma = 0, t_tma_kn = 0, t_part = 0, t_tma_part = 0, t_tma_part_kn = 0;
      double t_forkjoin = 0;
      timer.add(&t_cublas, R, [&](int r) { cublas_mla_bmm(cub, w[r], a, y); });
      timer.add(&t_ours, R, [&](int r) { cuda::bmm(a, w[r].transpose(1, 2), y, s); });
      const bool tma = cuda::bmm_tma(a, w[0].transpose(1, 2), y, s);  // M <= 64
      if (tma) {
        timer.add(&t_tma, R, [&](int r) { cuda::bmm_tma(a, w[r].transpose(1, 2), y, s); });
        timer.add(&t_tma_kn, R, [&](int r) { cuda::bmm_tma(a, w_kn[r], y, s); });
        timer.add(&t_tma_part, R, [&](int r) { cuda::bmm_tma_domains(a, shards[r], y, dslices, caller.native); });
        timer.add(&t_tma_part_kn, R, [&](int r) { cuda::bmm_tma_domains(a, shards_kn[r], y, dslices, caller.native); });
      }
      timer.add(&t_part, R, [&](int r) { ops::bmm_partitioned(a, shards[r], y, hslices, caller); });
      cuda::set_bmm_tma_enabled(false);  // the partitioned op as a fork/join of cuBLASLt calls
      timer.add(&t_forkjoin, R, [&](int r) { ops::bmm_partitioned(a, shards[r], y, hslices, caller); });
      cuda::set_bmm_tma_enabled(true);
      timer.run(30);
      const double io = double(M) * H * (K + N) * 2;
      std::printf("BMM %lldx%lldx%lld M=%4lld | cublas %7.1f | ours %7.1f (%.2fx) | TMA %7.1f, [K,N] %7.1f, %5.0f GB/s | "
                  "part %7.1f (unpart/part %.2f) | TMA part %7.1f, [K,N] %7.1f | fork/join %7.1f\n",
                  (long long)H, (long long)N, (long long)K, (long long)M, t_cublas * 1e6, t_ours * 1e6, t_cublas / t_ours,
                  t_tma * 1e6, t_tma_kn * 1e6, tma ? (wbytes + io) / t_tma * 1e-9 : 0.0, t_part * 1e6, t_ours / t_part,
                  t_tma_part * 1e6, t_tma_part_kn * 1e6, t_forkjoin * 1e6);
      std::fflush(stdout);
      char line[320];
      std::snprintf(line, sizeof line, "| %lld x %lld x %lld | %lld | %s | %s | %.2f | %s | %s | %s | %s | %.2f | %s | %s | %s |\n",
                    (long long)H, (long long)N, (long long)K, (long long)M, us(t_cublas).c_str(), us(t_ours).c_str(),
                    t_cublas / t_ours, us(t_tma).c_str(), us(t_tma_kn).c_str(),
                    tma ? std::to_string(static_cast<int>((wbytes + io) / t_tma * 1e-9)).c_str() : "-", us(t_part).c_str(),
                    t_ours / t_part, us(t_tma_part).c_str(), us(t_tma_part_kn).c_str(), us(t_forkjoin).c_str());
      bmm_md += line;
    }
  }

  // Markdown table (docs/benchmarks.md takes it as is).
  std::string md;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Device: %s, %d SMs; partitions: %s split, %d + %d SMs; measured copy bandwidth %.0f GB/s.\n\n",
                info.name.c_str(), info.sm_count, split.c_str(), parts[0].sm_count, parts[1].sm_count, bw * 1e-9);
  md += buf;
  md += "| N | K | M | cuBLAS us | cuBLASLt us | stream us | gemv us | ours us | ours/cuBLAS speed | ours GB/s | part us | "
        "unpart/part | gemv part us | fork/join part us | NVFP4 us | NVFP4 speed-up vs cuBLAS | NVFP4 GB/s | NVFP4 stream us | "
        "NVFP4 gemv us | NVFP4 mma.sync us | mma.sync speed-up | NVFP4 part us | unpart/part | NVFP4 part launch us | "
        "NVFP4 part fork/join us | NVFP4 part gemv launch us |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    const double io = double(r.m) * r.k * 2 + double(r.m) * r.n * 2;
    const double wb = double(r.n) * r.k * 2, fb = double(r.n) * r.k * 0.5625;
    std::snprintf(buf, sizeof buf, "| %lld | %lld | %lld | %s | %s | %s | %s | %s | %.2f | %.0f | %s | %.2f | %s | %s |",
                  (long long)r.n, (long long)r.k, (long long)r.m, us(r.cublas).c_str(), us(r.lt).c_str(),
                  us(r.stream).c_str(), us(r.gemv).c_str(), us(r.ours).c_str(), r.cublas / r.ours,
                  (wb + io) / r.ours * 1e-9, us(r.part).c_str(), r.ours / r.part, us(r.gemvpart).c_str(),
                  us(r.forkjoinpart).c_str());
    md += buf;
    if (r.fp4 > 0) {
      std::snprintf(buf, sizeof buf, " %s | %.2f | %.0f |", us(r.fp4).c_str(), r.cublas / r.fp4, (fb + io) / r.fp4 * 1e-9);
      md += buf;
    } else {
      md += " - | - | - |";
    }
    std::snprintf(buf, sizeof buf, " %s | %s |", us(r.fp4stream).c_str(), us(r.fp4gemv).c_str());
    md += buf;
    if (r.fp4mma > 0) {
      std::snprintf(buf, sizeof buf, " %s | %.2f |", us(r.fp4mma).c_str(), r.cublas / r.fp4mma);
      md += buf;
    } else {
      md += " - | - |";
    }
    if (r.fp4part > 0) {
      std::snprintf(buf, sizeof buf, " %s | %.2f |", us(r.fp4part).c_str(), r.fp4 / r.fp4part);
      md += buf;
    } else {
      md += " - | - |";
    }
    std::snprintf(buf, sizeof buf, " %s | %s | %s |\n", us(r.fp4partlaunch).c_str(), us(r.fp4partfj).c_str(),
                  us(r.fp4partgemv).c_str());
    md += buf;
  }
  md += bmm_md;
  std::printf("\n%s", md.c_str());
  if (!out_path.empty()) {
    FILE* fo = std::fopen(out_path.c_str(), "w");
    if (fo) {
      std::fputs(md.c_str(), fo);
      std::fclose(fo);
    }
  }
  cublasDestroy(cub);
  cuda::destroy_sm_partitions(parts);
  return 0;
}
