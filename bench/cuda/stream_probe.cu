// Ceilings of the weight-streaming GEMM's two halves on the device it runs on, measured apart:
// how fast a CTA's warps can pull a contiguous weight stream into shared memory (per-lane
// 16-byte cp.async, or one TMA bulk copy per stage), and how fast they can dequantize and
// multiply NVFP4 chunks that are already in shared memory, and both together. Standalone (no
// liblocus; CMake target cuda_stream_probe, carried by tools/gpu/package.sh). Prints a table row per
// configuration in GB/s of weight bytes streamed (NVFP4: 0.5625 B per weight). `--short`: one
// launch per DeepSeek-V3-sized weight (8-74 MB) instead of 512 MB, back to back, so that each warp
// has only a few chunks, as in the real kernel. `--producer`: the copies issued by a producer warp
// (the TMA feed's design) against each consumer warp's own, at 8 and 16 consumer warps per SM.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/tma.cuh"
#include "probe_timing.h"

using namespace locus::cuda::detail;

namespace {

constexpr int kChunkBytes = 2304;  // one NVFP4 row group chunk: 4 tiles x 512 codes + 4 x 64 scales

// The word encoding before 2026-12-03 (value j of pair p at bits 4p..4p+3, +16 for odd j), to
// time the kernel's dequantization against the current one (nvfp4_layout.h).
struct OldWordBits {
  __device__ static uint32_t pair(uint32_t w, int p) {
    const uint32_t v = w >> (4 * p);
    return ((v & 0x00070007u) << 6) | ((v & 0x00080008u) << 12);
  }
};

// The consumer of one landed stage: NVFP4 4-tile chunks (kCompute) or a read of every byte.
template <bool kCompute, int MB, bool kOldWords = false>
__device__ __forceinline__ void consume(uint32_t stage, int chunks, uint32_t xs, int lane, float (&acc)[4][MB][4],
                                        uint32_t& sink) {
  if constexpr (kCompute) {
    const int g = lane >> 2, t = lane & 3;
    uint4 xv[MB][2];
#pragma unroll
    for (int b = 0; b < MB; ++b) {
      const uint32_t at = xs + ((8 * b + g) * 4 + t) * 32;
      xv[b][0] = lds128(at);
      xv[b][1] = lds128(at + 16);
    }
    for (int c = 0; c < chunks; ++c) {
      const uint32_t s = stage + c * kChunkBytes;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        using Bits = std::conditional_t<kOldWords, OldWordBits, Nvfp4WordBits>;
        nvfp4_chunk_mma<MB, Bits>(lds128(s + r * 512 + lane * 16), lds16(s + 2048 + r * 64 + lane * 2), xv, acc[r]);
      }
    }
  } else {
    for (int off = lane * 16; off < chunks * kChunkBytes; off += 512) {
      const uint4 v = lds128(stage + off);
      sink ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
}

// Mode: 0 cp.async per lane, 1 one bulk copy per stage, 2 no copies (compute from a fixed stage).
template <int kMode, bool kCompute, int MB, bool kOldWords>
__global__ void probe(const uint8_t* __restrict__ w, int64_t bytes_per_warp, int stage_chunks, int stages,
                      unsigned* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int stage_bytes = stage_chunks * kChunkBytes;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t xs = base;                                  // 4 KB of "activations"
  const uint32_t bars = base + 4096;                         // 8 mbarriers (stages) per warp, 16 warps
  const uint32_t ring = base + 4096 + 8 * 128 + warp * stages * stage_bytes;
  const uint32_t bar0 = bars + warp * 8 * 8;
  if (kMode == 1 && lane == 0)
    for (int s = 0; s < stages; ++s) mbar_init(bar0 + 8 * s, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * warps + warp;
  const uint8_t* src = w + gw * bytes_per_warp;
  const int n = static_cast<int>(bytes_per_warp / stage_bytes);
  float acc[4][MB][4] = {};
  uint32_t sink = 0;
  auto issue = [&](int j) {
    if (kMode == 0) {
      if (j < n)
        for (int off = lane * 16; off < stage_bytes; off += 512)
          cp_async16(ring + (j % stages) * stage_bytes + off, src + static_cast<int64_t>(j) * stage_bytes + off);
      cp_async_commit();
    } else if (kMode == 1) {
      if (j < n && lane == 0)
        bulk_copy(ring + (j % stages) * stage_bytes, src + static_cast<int64_t>(j) * stage_bytes, stage_bytes,
                  bar0 + 8 * (j % stages));
    }
  };
  for (int j = 0; j < stages - 1; ++j) issue(j);
  for (int j = 0; j < n; ++j) {
    __syncwarp();
    issue(j + stages - 1);
    if (kMode == 0) {  // chunk j has landed when at most stages - 1 newer groups are pending
      if (stages == 4) cp_async_wait<3>();
      else if (stages == 6) cp_async_wait<5>();
      else cp_async_wait<7>();
    }
    if (kMode == 1) mbar_wait(bar0 + 8 * (j % stages), (j / stages) & 1);
    __syncwarp();
    consume<kCompute, MB, kOldWords>(kMode == 2 ? ring : ring + (j % stages) * stage_bytes, stage_chunks, xs, lane, acc, sink);
  }
  if (kMode == 0) cp_async_wait<0>();
  float f = 0;
  for (int r = 0; r < 4; ++r)
    for (int b = 0; b < MB; ++b)
      for (int e = 0; e < 4; ++e) f += acc[r][b][e];
  if (f == 12345.f || sink == 0x9e3779b9u) out[0] = 1;  // keeps the work alive
}

// Modes 3 and 4: a producer warp feeds the consumer warps (lane c fills warp c's ring), as the
// TMA feed of the streaming GEMM does (stream_gemm_tma_kernel.cu): full barriers that the copies
// complete, empty ones that the consumers' lane 0 arrives on, lanes that poll (test_wait, then a
// 32 ns sleep) and never block. kOps copies per stage: 1 (the stage's weight bytes at once) or 3
// (as the feed: the codes, the scales, and a 128-byte activation row from a small buffer that
// stays in L2). The consumers dequantize and multiply (the new word layout).
template <int kOps, int MB>
__global__ void probe_producer(const uint8_t* __restrict__ w, const uint8_t* __restrict__ x, int64_t bytes_per_warp,
                               int stage_chunks, int stages, unsigned* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kMaxWarps = 16, kMaxStages = 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x >> 5) - 1;
  const int weight_bytes = stage_chunks * kChunkBytes, scale_bytes = stage_chunks * 256;
  const int stage_bytes = weight_bytes + (kOps == 3 ? 128 : 0);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t xs = base;  // 4 KB of "activations"
  const uint32_t full0 = base + 4096, empty0 = full0 + 8 * kMaxWarps * kMaxStages;
  const uint32_t ring0 = empty0 + 8 * kMaxWarps * kMaxStages;
  auto full = [&](int c, int s) { return full0 + 8 * (c * kMaxStages + s); };
  auto empty = [&](int c, int s) { return empty0 + 8 * (c * kMaxStages + s); };
  auto ring = [&](int c, int s) { return ring0 + (c * stages + s) * stage_bytes; };
  if (static_cast<int>(threadIdx.x) < warps)
    for (int s = 0; s < stages; ++s) {
      mbar_init(full(threadIdx.x, s), 1);
      mbar_init(empty(threadIdx.x, s), 1);
    }
  mbar_init_fence();
  __syncthreads();
  const int n = static_cast<int>(bytes_per_warp / weight_bytes);
  if (warp == warps) {  // the producer
    if (lane >= warps) return;
    const uint8_t* src = w + (static_cast<int64_t>(blockIdx.x) * warps + lane) * bytes_per_warp;
    for (int k = 0; k < n;) {
      const int s = k % stages;
      if (k >= stages && !mbar_done(empty(lane, s), ((k / stages) & 1) ^ 1)) {
        __nanosleep(32);
        continue;
      }
      const uint32_t dst = ring(lane, s), bar = full(lane, s);
      const uint8_t* from = src + static_cast<int64_t>(k) * weight_bytes;
      mbar_expect(bar, stage_bytes);
      if (kOps == 1) {
        bulk_copy_to(dst, from, weight_bytes, bar);
      } else {
        bulk_copy_to(dst, from, weight_bytes - scale_bytes, bar);
        bulk_copy_to(dst + weight_bytes - scale_bytes, from + weight_bytes - scale_bytes, scale_bytes, bar);
        bulk_copy_to(dst + weight_bytes, x + (k % 32) * 128, 128, bar);
      }
      ++k;
    }
    return;
  }
  float acc[4][MB][4] = {};
  uint32_t sink = 0;
  for (int k = 0; k < n; ++k) {
    const int s = k % stages;
    mbar_wait(full(warp, s), (k / stages) & 1);
    consume<true, MB, false>(ring(warp, s), stage_chunks, xs, lane, acc, sink);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty(warp, s));
  }
  float f = 0;
  for (int r = 0; r < 4; ++r)
    for (int b = 0; b < MB; ++b)
      for (int e = 0; e < 4; ++e) f += acc[r][b][e];
  if (f == 12345.f || sink == 0x9e3779b9u) out[0] = 1;  // keeps the work alive
}

struct Config {
  int mode;
  int compute;  // 0 read, 1 NVFP4 mma with the old word encoding, 2 NVFP4 mma (nvfp4_layout.h)
  int mb, ctas_per_sm, warps, stage_chunks, stages;
};

template <int kMode, bool kCompute, int MB, bool kOldWords>
float run(const Config& c, const uint8_t* w, int64_t total, unsigned* out, int sms, int64_t slice = 0) {
  const int ctas = sms * c.ctas_per_sm;
  const int64_t warps = static_cast<int64_t>(ctas) * c.warps;
  const int64_t stage_bytes = static_cast<int64_t>(c.stage_chunks) * kChunkBytes;
  const int64_t per_warp = total / warps / stage_bytes * stage_bytes;
  const int smem = 4096 + 8 * 128 + c.warps * c.stages * static_cast<int>(stage_bytes);
  if (c.warps > 16 || c.stages > 8 || smem > 227 * 1024) return -1.f;
  auto* k = probe<kMode, kCompute, MB, kOldWords>;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int fit = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k, c.warps * 32, smem));
  if (fit < c.ctas_per_sm) return -1.f;
  const int launches = slice > 0 ? static_cast<int>(total / slice) : 1;  // back to back, rotating
  const int64_t per_warp_launch = slice > 0 ? slice / warps / stage_bytes * stage_bytes : per_warp;
  const float ms = median_batch_ms(2, 10, [&] {
    for (int l = 0; l < launches; ++l)
      k<<<ctas, c.warps * 32, smem>>>(w + l * per_warp_launch * warps, per_warp_launch, c.stage_chunks, c.stages, out);
  });
  return static_cast<float>(per_warp_launch * warps * launches) / (ms * 1e-3f) / 1e9f;
}

// Modes 3 (1 copy per stage) and 4 (3 copies) with c.warps consumer warps and a producer warp.
template <int kOps, int MB>
float run_producer(const Config& c, const uint8_t* w, const uint8_t* x, int64_t total, unsigned* out, int sms) {
  const int ctas = sms * c.ctas_per_sm;
  const int64_t warps = static_cast<int64_t>(ctas) * c.warps;
  const int64_t weight_bytes = static_cast<int64_t>(c.stage_chunks) * kChunkBytes;
  const int64_t per_warp = total / warps / weight_bytes * weight_bytes;
  const int stage_bytes = static_cast<int>(weight_bytes) + (kOps == 3 ? 128 : 0);
  const int smem = 4096 + 2 * 8 * 16 * 8 + c.warps * c.stages * stage_bytes;
  if (c.warps > 16 || c.stages > 8 || smem > 227 * 1024) return -1.f;
  auto* k = probe_producer<kOps, MB>;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int fit = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k, (c.warps + 1) * 32, smem));
  if (fit < c.ctas_per_sm) return -1.f;
  const float ms = median_batch_ms(2, 10, [&] {
    k<<<ctas, (c.warps + 1) * 32, smem>>>(w, x, per_warp, c.stage_chunks, c.stages, out);
  });
  return static_cast<float>(per_warp * warps) / (ms * 1e-3f) / 1e9f;
}

float dispatch(const Config& c, const uint8_t* w, int64_t total, unsigned* out, int sms, int64_t slice = 0) {
#define CASE(M, C, B) \
  if (c.mode == M && c.compute == C && c.mb == B) return run<M, C != 0, B, C == 1>(c, w, total, out, sms, slice);
  CASE(0, 0, 1) CASE(1, 0, 1)
  CASE(0, 1, 1) CASE(1, 1, 1) CASE(2, 1, 1) CASE(0, 1, 2) CASE(1, 1, 2) CASE(2, 1, 2)
  CASE(0, 2, 1) CASE(1, 2, 1) CASE(2, 2, 1) CASE(0, 2, 2) CASE(1, 2, 2) CASE(2, 2, 2)
#undef CASE
  return -2.f;
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t total = 1LL << 29;  // 512 MB of weights per launch (L2: 60 MB)
  uint8_t* w = nullptr;
  unsigned* out = nullptr;
  CHECK(cudaMalloc(&w, total + (64 << 20)));
  CHECK(cudaMemset(w, 0x35, total + (64 << 20)));
  CHECK(cudaMalloc(&out, 64));
  const char* names[] = {"cp.async", "bulk", "no-copy"};
  const char* consumers[] = {"read", "NVFP4 mma, old word layout", "NVFP4 mma, new word layout"};
  std::printf("| copy | consumer | M blocks | CTAs/SM | warps | chunks/stage | stages | GB/s |\n|---|---|---|---|---|---|---|---|\n");
  std::vector<Config> configs;
  for (int mode : {0, 1})
    for (int cps : {1, 2, 3})
      for (int warps : {4, 8})
        for (int sc : {1, 2, 4})
          for (int st : {4, 6, 8}) configs.push_back({mode, 0, 1, cps, warps, sc, st});
  for (int v : {1, 2})
  for (int mode : {0, 1, 2})
    for (int mb : {1, 2})
      for (int cps : {1, 2})
        for (int warps : {4, 8})
          for (int sc : {1, 2})
            for (int st : {4, 6}) configs.push_back({mode, v, mb, cps, warps, sc, st});
  if (argc > 1 && std::string(argv[1]) == "--producer") {
    // Who issues the copies, and how many per stage: each consumer warp's lane 0 one bulk copy
    // (mode 1), or a producer warp with 1 or 3 copies per stage (the TMA feed's design), at 8 and
    // 16 consumer warps per SM; steady state over 512 MB, M = 1 and 16.
    std::printf("| copy | CTAs/SM | consumer warps | M blocks | chunks/stage | stages | GB/s |\n|---|---|---|---|---|---|---|\n");
    const char* copy_names[] = {"", "lane 0 of each consumer warp, 1 bulk copy", "", "producer warp, 1 copy per stage",
                                "producer warp, 3 copies per stage"};
    for (int mode : {1, 3, 4})
      for (auto [cps, warps] : {std::pair{1, 8}, {2, 8}, {1, 16}})
        for (int mb : {1, 2})
          for (int sc : {1, 2})
            for (int st : {2, 3, 4, 6}) {
              const Config c{mode, 2, mb, cps, warps, sc, st};
              float gbs = -1.f;
              if (mode == 1) gbs = st >= 4 && mb == 1 ? dispatch(c, w, total, out, sms) : -1.f;
              else if (mode == 3) gbs = mb == 1 ? run_producer<1, 1>(c, w, w, total, out, sms) : run_producer<1, 2>(c, w, w, total, out, sms);
              else gbs = mb == 1 ? run_producer<3, 1>(c, w, w, total, out, sms) : run_producer<3, 2>(c, w, w, total, out, sms);
              if (gbs < 0) continue;
              std::printf("| %s | %d | %d | %d | %d | %d | %.0f |\n", copy_names[mode], cps, warps, mb, sc, st, gbs);
              std::fflush(stdout);
            }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "--short") {
    // One launch streams `slice` bytes (a DeepSeek-V3 projection's NVFP4 weight), launches back to
    // back over rotating slices: what is left of the ceilings when each warp has only a few chunks.
    std::printf("| copy | consumer | M blocks | CTAs/SM | warps | chunks/stage | stages | MB per launch | GB/s | us per launch |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (int64_t slice : {int64_t(28901376), int64_t(74317824), int64_t(8257536)})
      for (Config c : {Config{0, 0, 1, 2, 8, 1, 4}, Config{0, 2, 1, 2, 8, 1, 4}, Config{0, 2, 1, 1, 8, 1, 8},
                       Config{0, 2, 1, 2, 4, 1, 8}, Config{1, 2, 1, 2, 8, 1, 4}, Config{0, 2, 1, 1, 4, 2, 6},
                       Config{0, 2, 2, 2, 8, 1, 4}}) {
        const float gbs = dispatch(c, w, total, out, sms, slice);
        if (gbs < 0) continue;
        std::printf("| %s | %s | %d | %d | %d | %d | %d | %.1f | %.0f | %.1f |\n", names[c.mode], consumers[c.compute], c.mb,
                    c.ctas_per_sm, c.warps, c.stage_chunks, c.stages, slice / 1e6, gbs, slice / (gbs * 1e3));
      }
    return 0;
  }
  for (const Config& c : configs) {
    const float gbs = dispatch(c, w, total, out, sms);
    if (gbs < 0) continue;  // does not fit
    std::printf("| %s | %s | %d | %d | %d | %d | %d | %.0f |\n", names[c.mode], consumers[c.compute],
                c.mb, c.ctas_per_sm, c.warps, c.stage_chunks, c.stages, gbs);
  }
  return 0;
}
