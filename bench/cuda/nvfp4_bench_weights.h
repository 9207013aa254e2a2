// Random NVFP4 weights for the device benchmarks (header-only): host weights in the kLinear
// layout, ready for cuda::nvfp4_prepare, and their two row halves (the benchmarks' domain shards).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>

#include "core/tensor.h"
#include "ops/nvfp4.h"

namespace locus::bench {

// N x K random e2m1 codes, block scales 2^-3..2^3, global scale 1/2688.
inline ops::Nvfp4Weight random_fp4_host(int64_t n, int64_t k, std::mt19937_64& rng) {
  ops::Nvfp4Weight w = ops::nvfp4_empty(n, k, 1.f / 2688.f);
  auto* q = w.packed.data<uint8_t>();
  for (int64_t i = 0; i < n * k / 2; i += 8) {
    uint64_t r = rng();
    std::memcpy(q + i, &r, std::min<int64_t>(8, n * k / 2 - i));
  }
  auto* s = w.scales.data<uint8_t>();
  for (int64_t i = 0; i < n * k / 16; ++i) s[i] = static_cast<uint8_t>(0x20 + rng() % 0x30);  // 2^-3 .. 2^3
  return w;
}

// Rows [0, N/2) (which = 0) or [N/2, N) (which = 1) of a kLinear NVFP4 weight (host views).
inline ops::Nvfp4Weight half_rows(const ops::Nvfp4Weight& w, int which) {
  const int64_t n0 = which ? w.n / 2 : 0, n1 = which ? w.n : w.n / 2;
  return ops::nvfp4_rows(w, n0, n1);
}

}  // namespace locus::bench
