// Device benchmark of one MoE layer's routed-expert GEMMs at DeepSeek-V3's widths (NVFP4, hidden
// 7168, experts 2048 wide, 8 of E per token), run as MoE::forward runs them unpartitioned: each
// active expert's gate/up + SwiGLU, then its down projection, on the rows routed to it
// (ops::nvfp4_gemm_row_blocks). Each call draws its own uniform routing (fixed seed), so calls
// touch other experts, and a call's weights (8 experts: 198 MB at T = 1) exceed the L2.
// Columns (us per layer stage, the median over replays of a graph of R calls, graphs interleaved):
//   each     one launch per expert and projection (LOCUS_NVFP4_ROW_BLOCKS=0);
//   shared   experts with equal row counts share launches (the default when grouping);
//   by id    ops::nvfp4_gemm_indexed, as MoE decode runs where few pairs share an expert: one
//            launch per projection, each (token, choice) pair streaming its expert (an expert two
//            tokens chose is streamed twice);
//   one      one expert on the T token rows (the shared expert's stage): what a stage costs
//            beyond its bytes;
//   by id + shared  by id with a shared expert riding in the same launches (a second product of
//            ops::nvfp4_gemm_indexed with ids of zeros), as MoE decode of one token runs it: to
//            set against "by id" + "one";
//   floor    the active experts' weight bytes at the measured device copy bandwidth.
// usage: cuda_moe_experts_bench [--tokens T1,T2,..] [--experts E]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/stream_gemm.h"
#include "graph_timing.h"
#include "nvfp4_bench_weights.h"
#include "ops/nvfp4_indexed.h"
#include "ops/nvfp4_row_blocks.h"

using namespace locus;
using namespace locus::bench;

namespace {

constexpr int64_t kHidden = 7168, kInter = 2048, kTopK = 8;
constexpr int kCalls = 8;  // routings (calls) per graph

// One call: the blocks of a routing of T tokens (8 distinct experts each) over `experts`.
struct Routing {
  std::vector<ops::Nvfp4RowBlock> gate_up, down;
  std::vector<int32_t> ids;  // [tokens, 8]: each token's experts, in the order drawn
  int64_t active = 0;
  double weight_bytes = 0;
};

Routing route(int64_t tokens, int64_t experts, std::mt19937_64& rng, const std::vector<ops::Nvfp4Weight>& gate_up,
              const std::vector<ops::Nvfp4Weight>& down) {
  std::vector<int64_t> count(static_cast<size_t>(experts), 0), ids(static_cast<size_t>(experts));
  std::vector<int32_t> chosen;
  std::iota(ids.begin(), ids.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < kTopK; ++j) {  // a partial shuffle: 8 distinct experts
      std::uniform_int_distribution<int64_t> pick(j, experts - 1);
      std::swap(ids[static_cast<size_t>(j)], ids[static_cast<size_t>(pick(rng))]);
      ++count[static_cast<size_t>(ids[static_cast<size_t>(j)])];
    }
    chosen.insert(chosen.end(), ids.begin(), ids.begin() + kTopK);
  }
  Routing r;
  r.ids = std::move(chosen);
  int64_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = count[static_cast<size_t>(e)];
    if (n == 0) continue;
    r.gate_up.push_back({&gate_up[static_cast<size_t>(e)], row, n});
    r.down.push_back({&down[static_cast<size_t>(e)], row, n});
    r.weight_bytes += static_cast<double>(gate_up[static_cast<size_t>(e)].packed.nbytes() +
                                          gate_up[static_cast<size_t>(e)].scales.nbytes() +
                                          down[static_cast<size_t>(e)].packed.nbytes() +
                                          down[static_cast<size_t>(e)].scales.nbytes());
    ++r.active;
    row += n;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> token_counts = {1, 4, 8, 16};
  int64_t experts = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc) {
      if (!parse_m_list(argv[++i], 64, &token_counts)) return 2;
    } else if (a == "--experts" && i + 1 < argc) {
      experts = std::atoll(argv[++i]);
      if (experts < kTopK) {
        std::fprintf(stderr, "--experts must be at least %lld\n", static_cast<long long>(kTopK));
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown argument '%s'\nusage: cuda_moe_experts_bench [--tokens T1,T2,..] [--experts E]\n",
                   a.c_str());
      return 2;
    }
  }
  cudaStream_t s;
  if (!start_device_bench(&s)) return 1;
  const double bw = copy_bandwidth(s);
  std::printf("NVFP4 routed experts of one MoE layer: hidden %lld, experts %lld wide, %lld of %lld per token; "
              "copy bandwidth %.0f GB/s\n\n",
              static_cast<long long>(kHidden), static_cast<long long>(kInter), static_cast<long long>(kTopK),
              static_cast<long long>(experts), bw * 1e-9);

  std::mt19937_64 rng(42);
  std::vector<ops::Nvfp4Weight> gate_up, down;
  for (int64_t e = 0; e < experts; ++e) {
    gate_up.push_back(cuda::nvfp4_prepare(random_fp4_host(2 * kInter, kHidden, rng), 0, -1));
    down.push_back(cuda::nvfp4_prepare(random_fp4_host(kHidden, kInter, rng), 0, -1));
  }
  const Device dev = Device::cuda(0);
  std::vector<const ops::Nvfp4Weight*> gu_ptrs, dn_ptrs;
  for (int64_t e = 0; e < experts; ++e) {
    gu_ptrs.push_back(&gate_up[static_cast<size_t>(e)]);
    dn_ptrs.push_back(&down[static_cast<size_t>(e)]);
  }
  const ops::Nvfp4WeightSet gu_set(gu_ptrs), dn_set(dn_ptrs);
  // The shared expert of "by id + shared": one more expert's weights, its own set of one.
  const ops::Nvfp4Weight shared_gu = cuda::nvfp4_prepare(random_fp4_host(2 * kInter, kHidden, rng), 0, -1);
  const ops::Nvfp4Weight shared_dn = cuda::nvfp4_prepare(random_fp4_host(kHidden, kInter, rng), 0, -1);
  const ops::Nvfp4WeightSet shared_gu_set({&shared_gu}), shared_dn_set({&shared_dn});
  std::printf("| tokens | active experts (mean) | launches each / shared | each us | shared us | by id us | one us | "
              "by id + shared us | floor us | shared / floor | by id / floor |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const int64_t tokens : token_counts) {
    const int64_t rows = tokens * kTopK;
    Tensor x = Tensor::empty({rows, kHidden}, DType::kBF16, dev);
    Tensor h = Tensor::empty({rows + tokens, kInter}, DType::kBF16, dev);  // + the shared expert's rows
    Tensor y = Tensor::empty({rows + tokens, kHidden}, DType::kFP32, dev);
    const Tensor zeros = Tensor::zeros({tokens, 1}, DType::kI32).to(dev);
    fill_random_bf16(x, rng);
    std::vector<Routing> calls;
    std::vector<Tensor> ids;  // i32 [tokens, 8] per call, on the device
    double active = 0, bytes = 0;
    for (int c = 0; c < kCalls; ++c) {
      calls.push_back(route(tokens, experts, rng, gate_up, down));
      active += static_cast<double>(calls.back().active) / kCalls;
      bytes += calls.back().weight_bytes / kCalls;
      ids.push_back(Tensor::from_blob(calls.back().ids.data(), {tokens, kTopK}, DType::kI32).to(dev));
    }
    auto by_id = [&](int c) {
      const Tensor& id = ids[static_cast<size_t>(c)];
      ops::nvfp4_gemm_indexed(x.slice(0, 0, tokens), id, gu_set, h.slice(0, 0, rows), true, Stream{dev, s});
      ops::nvfp4_gemm_indexed(h.slice(0, 0, rows), id.view({rows, 1}), dn_set, y.slice(0, 0, rows), false, Stream{dev, s});
    };
    auto by_id_shared = [&](int c) {
      const Tensor& id = ids[static_cast<size_t>(c)];
      const Tensor xt = x.slice(0, 0, tokens), hr = h.slice(0, 0, rows), hs = h.slice(0, rows, rows + tokens);
      ops::nvfp4_gemm_indexed({{xt, id, &gu_set, hr}, {xt, zeros, &shared_gu_set, hs}}, true, Stream{dev, s});
      ops::nvfp4_gemm_indexed({{hr, id.view({rows, 1}), &dn_set, y.slice(0, 0, rows)},
                               {hs, zeros, &shared_dn_set, y.slice(0, rows, rows + tokens)}},
                              false, Stream{dev, s});
    };
    auto one = [&](int c) {  // expert c (distinct per call, so its weights are not in the L2)
      const std::vector<ops::Nvfp4RowBlock> gu{{&gate_up[static_cast<size_t>(c)], 0, tokens}};
      const std::vector<ops::Nvfp4RowBlock> dn{{&down[static_cast<size_t>(c)], 0, tokens}};
      ops::nvfp4_gemm_row_blocks(x, gu, h.slice(0, 0, rows), true, Stream{dev, s});
      ops::nvfp4_gemm_row_blocks(h.slice(0, 0, rows), dn, y.slice(0, 0, rows), false, Stream{dev, s});
    };
    auto stage = [&](int c) {
      ops::nvfp4_gemm_row_blocks(x, calls[static_cast<size_t>(c)].gate_up, h.slice(0, 0, rows), true, Stream{dev, s});
      ops::nvfp4_gemm_row_blocks(h.slice(0, 0, rows), calls[static_cast<size_t>(c)].down, y.slice(0, 0, rows), false,
                                 Stream{dev, s});
    };
    auto stream_launches = [] {
      return cuda::detail::stream_gemm_feed_launches(0) + cuda::detail::stream_gemm_feed_launches(1);
    };
    uint64_t launches[2];
    double t[2], t_id = 0, t_one = 0, t_id_shared = 0;
    InterleavedTimer timer(s);
    for (const int shared : {0, 1}) {
      cuda::set_nvfp4_row_block_launches(shared == 1);
      const uint64_t before = stream_launches();
      stage(0);
      launches[shared] = stream_launches() - before;
      timer.add(&t[shared], kCalls, stage);
    }
    timer.add(&t_id, kCalls, by_id);
    timer.add(&t_one, kCalls, one);
    timer.add(&t_id_shared, kCalls, by_id_shared);
    timer.run(20);
    const double floor = bytes / bw;
    std::printf("| %lld | %.1f | %llu / %llu | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n",
                static_cast<long long>(tokens), active, static_cast<unsigned long long>(launches[0]),
                static_cast<unsigned long long>(launches[1]), t[0] * 1e6, t[1] * 1e6, t_id * 1e6, t_one * 1e6,
                t_id_shared * 1e6, floor * 1e6, t[1] / floor, t_id / floor);
  }
  cuda::set_nvfp4_row_block_launches(true);
  std::printf("\n(launches: of call 0's stage, streaming kernel only; each = one per expert and projection)\n");
  return 0;
}
