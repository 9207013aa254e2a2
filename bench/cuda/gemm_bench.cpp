// Device benchmark of the CUDA GEMMs at DeepSeek-V3 shapes (own main, CUDA-event timing).
//
// For every N x K and M it times, as CUDA graphs of R back-to-back calls over R rotating weight
// copies (R chosen so the weights total > 240 MB, four times the H200's L2), the median over
// many replays of:
//   cublas   plain cuBLAS cublasGemmEx (default algorithm), the reference;
//   ours     locus::cuda::gemm (cuBLASLt, tactic timed once per shape);
//   part     the same split over 2 green-context SM partitions (emulated locality domains):
//            fork, one GEMM per partition on its stream writing its column slice, join;
//   part1    the same partitioned GEMMs with one fork/join around all R of them (how a layer
//            group runs: a green-context fork/join costs ~4.6 us in a graph, so it is amortized);
//   fp4      locus::cuda::nvfp4_gemm (our weight-only kernel) at M <= 128;
//   fp4part  the NVFP4 GEMM split over the 2 partitions, at M <= 16.
// and prints ratios, achieved GB/s and the measured copy bandwidth.
//
// usage: cuda_gemm_bench [--split backfill|aligned] [--quick] [--out FILE]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "core/float_convert.h"
#include "core/tensor.h"

using namespace locus;

namespace {

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median seconds per call of a graph that holds `calls` calls, over `reps` replays.
double time_graph(const cuda::Graph& g, cudaStream_t s, int calls, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) g.replay(s);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    g.replay(s);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

cuda::Graph capture(cudaStream_t s, const std::function<void()>& body) {
  body();  // eager once: tactic tuning and scratch growth happen outside the capture
  CK(cudaStreamSynchronize(s));
  cuda::device_synchronize(0);
  cuda::Graph g;
  g.begin_capture(s);
  body();
  g.end_capture();
  return g;
}

// Device-to-device copy bandwidth (bytes read + written per second), 2 GiB.
double copy_bandwidth(cudaStream_t s) {
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
void fill_random_bf16(const Tensor& t, std::mt19937_64& rng) {
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

ops::Nvfp4Weight random_fp4_host(int64_t n, int64_t k, std::mt19937_64& rng) {
  ops::Nvfp4Weight w;
  w.n = n;
  w.k = k;
  w.packed = Tensor::empty({n, k / 2}, DType::kFP4E2M1x2);
  w.scales = Tensor::empty({n, k / 16}, DType::kFP8E4M3);
  auto* q = w.packed.data<uint8_t>();
  for (int64_t i = 0; i < n * k / 2; i += 8) {
    uint64_t r = rng();
    std::memcpy(q + i, &r, std::min<int64_t>(8, n * k / 2 - i));
  }
  auto* s = w.scales.data<uint8_t>();
  for (int64_t i = 0; i < n * k / 16; ++i) s[i] = static_cast<uint8_t>(0x20 + rng() % 0x30);  // 2^-3 .. 2^3
  w.global_scale = 1.f / 2688.f;
  return w;
}

struct Row {
  int64_t n, k, m;
  double cublas = 0, ours = 0, part = 0, part1 = 0, fp4 = 0, fp4part = 0, fp4part1 = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string split = "backfill", out_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--split" && i + 1 < argc) split = argv[++i];
    else if (a == "--quick") quick = true;
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument '%s'\nusage: cuda_gemm_bench [--split backfill|aligned] [--quick] [--out FILE]\n",
                   a.c_str());
      return 2;
    }
  }
  if (split != "backfill" && split != "aligned") {
    std::fprintf(stderr, "--split must be backfill or aligned, got '%s'\n", split.c_str());
    return 2;
  }
  if (!cuda::device_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const auto info = cuda::query_device(0);
  auto parts = cuda::create_sm_partitions(0, 2, split == "aligned" ? cuda::SplitMode::kAligned : cuda::SplitMode::kBackfill);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<void*> pstreams = {parts[0].stream, parts[1].stream};
  cublasHandle_t cub;
  cublasCreate(&cub);
  void* cub_ws;
  CK(cudaMalloc(&cub_ws, 32 << 20));
  cublasSetWorkspace(cub, cub_ws, 32 << 20);
  cublasSetStream(cub, s);

  const double bw = copy_bandwidth(s);
  std::printf("device: %s, %d SMs, L2 %d MB; partitions (%s): %d + %d SMs; copy bandwidth %.0f GB/s\n",
              info.name.c_str(), info.sm_count, info.l2_bytes >> 20, split.c_str(), parts[0].sm_count, parts[1].sm_count,
              bw * 1e-9);

  std::vector<std::pair<int64_t, int64_t>> shapes = {{7168, 7168}, {18432, 7168}, {7168, 18432}, {4096, 7168},
                                                     {24576, 1536}, {32768, 512}, {7168, 2048}};
  std::vector<int64_t> ms = {1, 8, 16, 32, 128, 512, 4096};
  if (quick) {
    shapes = {{7168, 7168}, {18432, 7168}};
    ms = {1, 16, 512};
  }
  std::mt19937_64 rng(12345);
  std::vector<Row> rows;
  const Device dev = Device::cuda(0);
  for (auto [N, K] : shapes) {
    const double wbytes = double(N) * K * 2;
    const int R = static_cast<int>(std::clamp(std::ceil(240e6 / wbytes), 2.0, 16.0));
    std::vector<Tensor> w(R), sh0(R), sh1(R);
    for (int r = 0; r < R; ++r) {
      w[r] = Tensor::empty({N, K}, DType::kBF16, dev);
      fill_random_bf16(w[r], rng);
      sh0[r] = w[r].slice(0, 0, N / 2).clone();  // per-domain shard copies
      sh1[r] = w[r].slice(0, N / 2, N).clone();
    }
    // NVFP4: one random weight prepared, then device copies for rotation.
    const double fbytes = double(N) * K * 0.5625;
    const int RF = static_cast<int>(std::clamp(std::ceil(240e6 / fbytes), 2.0, 32.0));
    ops::Nvfp4Weight host_fp4 = random_fp4_host(N, K, rng);
    ops::Nvfp4Weight base = cuda::nvfp4_prepare(host_fp4, 0, -1);
    ops::Nvfp4Weight lin0 = host_fp4, lin1 = host_fp4;
    lin0.packed = host_fp4.packed.slice(0, 0, N / 2);
    lin0.scales = host_fp4.scales.slice(0, 0, N / 2);
    lin0.n = N / 2;
    lin1.packed = host_fp4.packed.slice(0, N / 2, N);
    lin1.scales = host_fp4.scales.slice(0, N / 2, N);
    lin1.n = N - N / 2;
    ops::Nvfp4Weight base0 = cuda::nvfp4_prepare(lin0, 0, 0), base1 = cuda::nvfp4_prepare(lin1, 0, 1);
    std::vector<ops::Nvfp4Weight> f(RF), f0(RF), f1(RF);
    for (int r = 0; r < RF; ++r) {
      f[r] = cuda::nvfp4_clone(base, -1);
      f0[r] = cuda::nvfp4_clone(base0, 0);
      f1[r] = cuda::nvfp4_clone(base1, 1);
    }
    for (int64_t M : ms) {
      Tensor x = Tensor::empty({M, K}, DType::kBF16, dev);
      fill_random_bf16(x, rng);
      Tensor y = Tensor::empty({M, N}, DType::kBF16, dev);
      Row row{N, K, M};
      const int reps = M >= 512 ? 10 : 30;
      const float alpha = 1.f, beta = 0.f;
      {
        auto g = capture(s, [&] {
          for (int r = 0; r < R; ++r)
            cublasGemmEx(cub, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w[r].data_ptr(), CUDA_R_16BF, K, x.data_ptr(),
                         CUDA_R_16BF, K, &beta, y.data_ptr(), CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        });
        row.cublas = time_graph(g, s, R, reps);
      }
      {
        auto g = capture(s, [&] {
          for (int r = 0; r < R; ++r) cuda::gemm(x, w[r], {}, y, s);
        });
        row.ours = time_graph(g, s, R, reps);
      }
      {
        Tensor y0 = y.slice(1, 0, N / 2), y1 = y.slice(1, N / 2, N);
        auto g = capture(s, [&] {
          for (int r = 0; r < R; ++r) {
            cuda::fork_streams(s, pstreams);
            cuda::gemm(x, sh0[r], {}, y0, parts[0].stream);
            cuda::gemm(x, sh1[r], {}, y1, parts[1].stream);
            cuda::join_streams(s, pstreams);
          }
        });
        row.part = time_graph(g, s, R, reps);
        auto g1 = capture(s, [&] {
          cuda::fork_streams(s, pstreams);
          for (int r = 0; r < R; ++r) {
            cuda::gemm(x, sh0[r], {}, y0, parts[0].stream);
            cuda::gemm(x, sh1[r], {}, y1, parts[1].stream);
          }
          cuda::join_streams(s, pstreams);
        });
        row.part1 = time_graph(g1, s, R, reps);
      }
      if (M <= 128) {
        auto g = capture(s, [&] {
          for (int r = 0; r < RF; ++r) cuda::nvfp4_gemm(x, f[r], {}, y, s);
        });
        row.fp4 = time_graph(g, s, RF, reps);
      }
      if (M <= 16) {
        Tensor y0 = y.slice(1, 0, N / 2), y1 = y.slice(1, N / 2, N);
        auto g = capture(s, [&] {
          for (int r = 0; r < RF; ++r) {
            cuda::fork_streams(s, pstreams);
            cuda::nvfp4_gemm(x, f0[r], {}, y0, parts[0].stream);
            cuda::nvfp4_gemm(x, f1[r], {}, y1, parts[1].stream);
            cuda::join_streams(s, pstreams);
          }
        });
        row.fp4part = time_graph(g, s, RF, reps);
        auto g1 = capture(s, [&] {
          cuda::fork_streams(s, pstreams);
          for (int r = 0; r < RF; ++r) {
            cuda::nvfp4_gemm(x, f0[r], {}, y0, parts[0].stream);
            cuda::nvfp4_gemm(x, f1[r], {}, y1, parts[1].stream);
          }
          cuda::join_streams(s, pstreams);
        });
        row.fp4part1 = time_graph(g1, s, RF, reps);
      }
      rows.push_back(row);
      const double io = double(M) * K * 2 + double(M) * N * 2;
      std::printf(
          "N=%6lld K=%6lld M=%5lld | cublas %8.1f us | ours %8.1f us (%.2fx) %6.0f GB/s %6.1f TF/s | part %8.1f us "
          "(unpart/part %.2f)",
          (long long)N, (long long)K, (long long)M, row.cublas * 1e6, row.ours * 1e6, row.cublas / row.ours,
          (wbytes + io) / row.ours * 1e-9, 2.0 * M * N * K / row.ours * 1e-12, row.part * 1e6, row.ours / row.part);
      std::printf(" | part1 %8.1f us (%.2f)", row.part1 * 1e6, row.ours / row.part1);
      if (row.fp4 > 0)
        std::printf(" | fp4 %7.1f us (%.2fx vs cublas) %6.0f GB/s", row.fp4 * 1e6, row.cublas / row.fp4,
                    (fbytes + io) / row.fp4 * 1e-9);
      if (row.fp4part > 0)
        std::printf(" | fp4part %7.1f us (%.2f) fp4part1 %7.1f us (%.2f)", row.fp4part * 1e6, row.fp4 / row.fp4part,
                    row.fp4part1 * 1e6, row.fp4 / row.fp4part1);
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  // Markdown table (docs/benchmarks.md takes it as is).
  std::string md;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Device: %s, %d SMs; partitions: %s split, %d + %d SMs; measured copy bandwidth %.0f GB/s.\n\n",
                info.name.c_str(), info.sm_count, split.c_str(), parts[0].sm_count, parts[1].sm_count, bw * 1e-9);
  md += buf;
  md += "| N | K | M | cuBLAS us | ours us | ours/cuBLAS speed | ours GB/s | part us | unpart/part | part (1 fork/join) us | unpart/part | NVFP4 us | NVFP4 speed-up vs cuBLAS | NVFP4 GB/s | NVFP4 part us | unpart/part | NVFP4 part (1 fork/join) us | unpart/part |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    const double io = double(r.m) * r.k * 2 + double(r.m) * r.n * 2;
    const double wb = double(r.n) * r.k * 2, fb = double(r.n) * r.k * 0.5625;
    std::snprintf(buf, sizeof buf, "| %lld | %lld | %lld | %.1f | %.1f | %.2f | %.0f | %.1f | %.2f | %.1f | %.2f |",
                  (long long)r.n, (long long)r.k, (long long)r.m, r.cublas * 1e6, r.ours * 1e6, r.cublas / r.ours,
                  (wb + io) / r.ours * 1e-9, r.part * 1e6, r.ours / r.part, r.part1 * 1e6, r.ours / r.part1);
    md += buf;
    if (r.fp4 > 0) {
      std::snprintf(buf, sizeof buf, " %.1f | %.2f | %.0f |", r.fp4 * 1e6, r.cublas / r.fp4, (fb + io) / r.fp4 * 1e-9);
      md += buf;
    } else {
      md += " - | - | - |";
    }
    if (r.fp4part > 0) {
      std::snprintf(buf, sizeof buf, " %.1f | %.2f | %.1f | %.2f |\n", r.fp4part * 1e6, r.fp4 / r.fp4part,
                    r.fp4part1 * 1e6, r.fp4 / r.fp4part1);
      md += buf;
    } else {
      md += " - | - | - | - |\n";
    }
  }
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
