// Device benchmark of MLA's absorbed decode attention at DeepSeek-V3's sizes (128 heads over one
// latent head of 512 + 64 dims, one new token per sequence), as one layer of a decode step runs
// it for a batch of B sequences of S keys each, with one ops::mla_attention_batch call:
//   tensor-core   on the tensor-core kernel (64 query rows a CTA, key splits to fill the GPU);
//   decode/K      on the CUDA-core decode kernel (4 heads a CTA), key splits of K keys or more
//                 (one column for each K of --split-keys);
//   as chosen     the op's own choice (the decode kernel up to LOCUS_ATTN_DECODE_MAX_KEYS keys of
//                 all sequences, splits of LOCUS_ATTN_DECODE_SPLIT_KEYS keys or more).
// Columns: us per layer call (median over replays of a graph of R calls, the graphs
// interleaved), and the caches' bytes read per second as chosen; each call reads its own copy of
// the caches (rotated so that they exceed the L2).
// usage: cuda_attention_bench [--batches B1,B2,..] [--keys S1,S2,..] [--split-keys K1,K2,..]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/cuda_attention.h"
#include "graph_timing.h"
#include "ops/attention.h"

using namespace locus;
using namespace locus::bench;

namespace {

constexpr int64_t kHeads = 128, kLatent = 512, kRope = 64;

// One batch's operands: queries and a cache per sequence, `copies` times over.
struct Batch {
  std::vector<Tensor> q_lat, q_pe, out;          // per copy
  std::vector<std::vector<ops::AttentionKeys>> keys;  // per copy, per sequence
};

Batch make_batch(int64_t B, int64_t S, int copies, std::mt19937_64& rng) {
  Batch b;
  for (int c = 0; c < copies; ++c) {
    b.q_lat.push_back(Tensor::empty({B, kHeads, kLatent}, DType::kBF16, Device::cuda(0)));
    b.q_pe.push_back(Tensor::empty({B, kHeads, kRope}, DType::kBF16, Device::cuda(0)));
    b.out.push_back(Tensor::empty({B, kHeads, kLatent}, DType::kBF16, Device::cuda(0)));
    fill_random_bf16(b.q_lat.back(), rng);
    fill_random_bf16(b.q_pe.back(), rng);
    std::vector<ops::AttentionKeys> keys;
    for (int64_t i = 0; i < B; ++i) {
      Tensor cache = Tensor::empty({S, kLatent + kRope}, DType::kBF16, Device::cuda(0));
      fill_random_bf16(cache, rng);
      const Tensor kv = cache.slice(1, 0, kLatent).unsqueeze(1);
      keys.push_back({kv, cache.slice(1, kLatent, kLatent + kRope).unsqueeze(1), kv});
    }
    b.keys.push_back(std::move(keys));
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> batches = {1, 2, 8, 32}, key_counts = {64, 128, 256, 512, 1024, 4096},
                       split_keys = {32, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && i + 1 < argc) {
      if (!parse_m_list(argv[++i], 256, &batches)) return 2;
    } else if (a == "--keys" && i + 1 < argc) {
      if (!parse_m_list(argv[++i], 1 << 20, &key_counts)) return 2;
    } else if (a == "--split-keys" && i + 1 < argc) {
      if (!parse_m_list(argv[++i], 512, &split_keys)) return 2;
    } else {
      std::fprintf(stderr,
                   "unknown argument '%s'\nusage: cuda_attention_bench [--batches B1,..] [--keys S1,..] "
                   "[--split-keys K1,..]\n",
                   a.c_str());
      return 2;
    }
  }
  cudaStream_t s;
  if (!start_device_bench(&s)) return 1;
  const double bw = copy_bandwidth(s);
  std::printf("MLA absorbed decode attention: %lld heads, latent %lld + rope %lld, one new token per sequence; copy "
              "bandwidth %.0f GB/s\n\n",
              static_cast<long long>(kHeads), static_cast<long long>(kLatent), static_cast<long long>(kRope),
              bw * 1e-9);
  std::string head = "| sequences | keys each | tensor-core us |", rule = "|---|---|---|";
  for (int64_t k : split_keys) {
    head += " decode/" + std::to_string(k) + " us |";
    rule += "---|";
  }
  std::printf("%s best decode / tensor-core | as chosen us | as chosen GB/s | of copy |\n%s---|---|---|---|\n",
              head.c_str(), rule.c_str());
  std::mt19937_64 rng(7);
  const float scale = 0.1f;
  constexpr int64_t kDefault = -1, kTensorCore = 0, kDecode = int64_t{1} << 40;  // decode max keys
  for (int64_t B : batches) {
    for (int64_t S : key_counts) {
      const double bytes = static_cast<double>(B * S * (kLatent + kRope) * 2);
      const int copies = rotating_copies(bytes, 8);
      const Batch b = make_batch(B, S, copies, rng);
      constexpr int kCalls = 16;
      // The kernel is chosen when a call is captured: each column sets its choice first.
      auto call = [&](int64_t max_keys, int64_t split, int r) {
        const int c = r % copies;
        cuda::set_attention_decode_max_keys(max_keys);
        cuda::set_attention_decode_split_keys(split);
        ops::mla_attention_batch(b.q_lat[c], b.q_pe[c], b.keys[c], b.out[c], scale, Stream{Device::cuda(0), s});
        cuda::set_attention_decode_max_keys(kDefault);
        cuda::set_attention_decode_split_keys(kDefault);
      };
      const size_t n = split_keys.size();
      std::vector<double> t(n + 2, 0.0);  // tensor-core, decode per split length, as chosen
      InterleavedTimer timer(s);
      timer.add(&t[0], kCalls, [&](int r) { call(kTensorCore, kDefault, r); });
      for (size_t i = 0; i < n; ++i)
        timer.add(&t[1 + i], kCalls, [&, i](int r) { call(kDecode, split_keys[i], r); });
      timer.add(&t[n + 1], kCalls, [&](int r) { call(kDefault, kDefault, r); });
      timer.run(20);
      std::printf("| %lld | %lld | %.1f |", static_cast<long long>(B), static_cast<long long>(S), t[0] * 1e6);
      double best = t[1];
      for (size_t i = 0; i < n; ++i) {
        std::printf(" %.1f |", t[1 + i] * 1e6);
        best = std::min(best, t[1 + i]);
      }
      const double chosen = t[n + 1];
      std::printf(" %.2f | %.1f | %.0f | %.0f%% |\n", best / t[0], chosen * 1e6, bytes / chosen * 1e-9,
                  100.0 * bytes / chosen / bw);
    }
  }
  return 0;
}
