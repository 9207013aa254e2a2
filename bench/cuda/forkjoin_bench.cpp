// Where the time of a partitioned BF16 GEMM / BMM goes on 2 emulated locality domains (green-context
// SM partitions) when it runs as a fork/join of one cuBLASLt call per domain stream. Each figure is
// the median per call over replays of a CUDA graph of R back-to-back calls on R rotating weights
// (together > 240 MB, 4x the H200's L2; the columns' graphs replayed in turn), as in gemm_bench.
// Columns (us per call):
//   unpart   ops::gemm on the caller stream, all SMs (the reference of the partitioned ratio);
//   half     one half of the rows on the caller stream, all SMs;
//   serial   both halves one after the other on the caller stream (no fork, no join);
//   green1   one half on domain 0's stream between a fork and a join (half the SMs);
//   green2   ops::gemm_partitioned over both domains (the real partitioned op);
//   plain2   the same fork/join on two ordinary streams (all SMs each, no green contexts).
// So green2 - green1 is what the second domain adds, green1 - half the cost of half the SMs plus
// one fork/join, and plain2 vs green2 what green contexts cost.
// usage: cuda_forkjoin_bench [--split backfill|aligned]
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "graph_timing.h"
#include "ops/bmm.h"
#include "ops/gemm.h"
#include "ops/partitioned.h"

using namespace locus;
using namespace locus::bench;

namespace {

struct Columns {
  double unpart, half, serial, green1, green2, plain2;
};

void print_row(const char* label, long long m, const Columns& c) {
  std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", label, m, c.unpart * 1e6,
              c.half * 1e6, c.serial * 1e6, c.green1 * 1e6, c.green2 * 1e6, c.plain2 * 1e6, c.unpart / c.green2,
              c.unpart / c.plain2);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string split;
  if (const int rc = split_from_args(argc, argv, "cuda_forkjoin_bench [--split backfill|aligned]", &split)) return rc;
  std::vector<cuda::SmPartition> parts;
  if (const int rc = make_two_domains(split, &parts)) return rc;
  cudaStream_t s, plain[2];
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (auto& p : plain) CK(cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking));
  const Device dev = Device::cuda(0);
  const Stream caller{dev, s};
  const Stream green[2] = {{dev, parts[0].stream}, {dev, parts[1].stream}};
  const Stream ordinary[2] = {{dev, plain[0]}, {dev, plain[1]}};
  std::printf("partitions (%s): %d + %d SMs\n\n", split.c_str(), parts[0].sm_count, parts[1].sm_count);
  std::printf("| shape | M | unpart us | half us | serial us | green1 us | green2 us | plain2 us | unpart/green2 | unpart/plain2 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937_64 rng(3);

  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {7168, 2048}, {32768, 512}, {7168, 7168}, {18432, 7168}}) {
    const int R = rotating_copies(double(N) * K * 2);
    std::vector<Tensor> w(R), sh0(R), sh1(R);
    for (int r = 0; r < R; ++r) {
      w[r] = Tensor::empty({N, K}, DType::kBF16, dev);
      fill_random_bf16(w[r], rng);
      sh0[r] = w[r].slice(0, 0, N / 2).clone();
      sh1[r] = w[r].slice(0, N / 2, N).clone();
    }
    for (int64_t M : {1, 16, 128, 512}) {
      Tensor x = Tensor::empty({M, K}, DType::kBF16, dev), y = Tensor::empty({M, N}, DType::kBF16, dev);
      fill_random_bf16(x, rng);
      const Tensor y0 = y.slice(1, 0, N / 2), y1 = y.slice(1, N / 2, N);
      auto slices = [&](const Stream (&st)[2]) {
        return std::vector<ops::PartitionSlice>{{0, N / 2, st[0]}, {N / 2, N, st[1]}};
      };
      Columns c{};
      InterleavedTimer timer(s);
      timer.add(&c.unpart, R, [&](int r) { ops::gemm(x, w[r], {}, y, caller); });
      timer.add(&c.half, R, [&](int r) { ops::gemm(x, sh0[r], {}, y0, caller); });
      timer.add(&c.serial, R, [&](int r) {
        ops::gemm(x, sh0[r], {}, y0, caller);
        ops::gemm(x, sh1[r], {}, y1, caller);
      });
      timer.add(&c.green1, R, [&](int r) {
        ops::run_partitioned(caller, {green[0]}, [&](int) { ops::gemm(x, sh0[r], {}, y0, green[0]); });
      });
      timer.add(&c.green2, R, [&](int r) { ops::gemm_partitioned(x, {sh0[r], sh1[r]}, {}, y, slices(green), caller); });
      timer.add(&c.plain2, R, [&](int r) { ops::gemm_partitioned(x, {sh0[r], sh1[r]}, {}, y, slices(ordinary), caller); });
      timer.run(30);
      const std::string label = std::to_string(N) + " x " + std::to_string(K);
      print_row(label.c_str(), M, c);
    }
  }

  // MLA's absorbed BMM, split over its 128 heads (per-head weights [N, K] stored [K, N]-transposed).
  for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{512, 128}, {128, 512}}) {
    const int64_t H = 128;
    const int R = rotating_copies(double(H) * N * K * 2);
    std::vector<Tensor> w(R), sh0(R), sh1(R);
    for (int r = 0; r < R; ++r) {
      w[r] = Tensor::empty({H, N, K}, DType::kBF16, dev);
      fill_random_bf16(w[r], rng);
      sh0[r] = w[r].slice(0, 0, H / 2).clone().transpose(1, 2);
      sh1[r] = w[r].slice(0, H / 2, H).clone().transpose(1, 2);
    }
    for (int64_t M : {1, 16}) {
      Tensor xa = Tensor::empty({M, H, K}, DType::kBF16, dev), ya = Tensor::empty({M, H, N}, DType::kBF16, dev);
      fill_random_bf16(xa, rng);
      const Tensor a = xa.transpose(0, 1), y = ya.transpose(0, 1);  // [H, M, K], [H, M, N]
      const Tensor a0 = a.slice(0, 0, H / 2), a1 = a.slice(0, H / 2, H), y0 = y.slice(0, 0, H / 2), y1 = y.slice(0, H / 2, H);
      auto slices = [&](const Stream (&st)[2]) {
        return std::vector<ops::PartitionSlice>{{0, H / 2, st[0]}, {H / 2, H, st[1]}};
      };
      Columns c{};
      InterleavedTimer timer(s);
      timer.add(&c.unpart, R, [&](int r) { ops::bmm(a, w[r].transpose(1, 2), y, caller); });
      timer.add(&c.half, R, [&](int r) { ops::bmm(a0, sh0[r], y0, caller); });
      timer.add(&c.serial, R, [&](int r) {
        ops::bmm(a0, sh0[r], y0, caller);
        ops::bmm(a1, sh1[r], y1, caller);
      });
      timer.add(&c.green1, R, [&](int r) {
        ops::run_partitioned(caller, {green[0]}, [&](int) { ops::bmm(a0, sh0[r], y0, green[0]); });
      });
      timer.add(&c.green2, R, [&](int r) { ops::bmm_partitioned(a, {sh0[r], sh1[r]}, y, slices(green), caller); });
      timer.add(&c.plain2, R, [&](int r) { ops::bmm_partitioned(a, {sh0[r], sh1[r]}, y, slices(ordinary), caller); });
      timer.run(30);
      const std::string label = "BMM 128 x " + std::to_string(N) + " x " + std::to_string(K);
      print_row(label.c_str(), M, c);
    }
  }
  for (auto& p : plain) cudaStreamDestroy(p);
  cuda::destroy_sm_partitions(parts);
  return 0;
}
