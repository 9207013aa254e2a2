// The caching allocator behind the CUDA DeviceHooks (cuda_hooks.cpp over core/block_cache.h):
// reuse per domain, live-byte accounting unchanged, release back to the driver, the
// out-of-memory error, poisoning, and a cache miss inside a CUDA graph capture.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/device_hooks.h"
#include "cuda_test_util.h"
#include "runtime/runtime_test_util.h"

namespace locus::testing {
namespace {

const Device kDev = Device::cuda(0);

size_t driver_free_bytes() {
  size_t free_b = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_b, &total), cudaSuccess);
  return free_b;
}

TEST(CudaAllocator, FreedBlocksAreReusedInTheirDomainAndLiveBytesStayExact) {
  LOCUS_REQUIRE_GPU();
  release_device_cache(kDev);  // an empty cache: the pointers below are predictable
  const int64_t live0 = memory_stats(kDev, 0).live_bytes;
  const CacheStats c0 = device_cache_stats(kDev, 0);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000}, DType::kU8, kDev, 0);
    first = t.data_ptr();
    EXPECT_EQ(memory_stats(kDev, 0).live_bytes, live0 + 1000);  // tensor bytes, not block bytes
    EXPECT_EQ(device_cache_stats(kDev, 0).used_bytes, c0.used_bytes + 1024);
  }
  EXPECT_EQ(memory_stats(kDev, 0).live_bytes, live0);
  EXPECT_EQ(device_cache_stats(kDev, 0).cached_bytes, c0.cached_bytes + 1024);
  Tensor other_domain = Tensor::empty({1000}, DType::kU8, kDev, 1);
  EXPECT_NE(other_domain.data_ptr(), first);
  Tensor again = Tensor::empty({900}, DType::kU8, kDev, 0);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(device_cache_stats(kDev, 0).hits, c0.hits + 1);
  // The reused block holds correct data after a copy (the copy waits for the device first).
  Tensor host = Tensor::empty({900}, DType::kU8);
  for (int i = 0; i < 900; ++i) host.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  again.copy_(host);
  EXPECT_TRUE(bitwise_equal(again, host));
}

TEST(CudaAllocator, ReleaseGivesCachedBlocksBackToTheDriver) {
  LOCUS_REQUIRE_GPU();
  const int64_t bytes = int64_t{512} << 20;
  Tensor::empty({bytes}, DType::kU8, kDev);  // freed at once: cached
  EXPECT_GE(device_cache_total(kDev).cached_bytes, bytes);
  const size_t before = driver_free_bytes();
  EXPECT_GE(release_device_cache(kDev), bytes);
  EXPECT_EQ(device_cache_total(kDev).cached_bytes, 0);
  EXPECT_GE(driver_free_bytes(), before + static_cast<size_t>(bytes) - (size_t{4} << 20));
}

TEST(CudaAllocator, OutOfMemoryNamesSizeDeviceAndDomainAndLeavesTheAllocatorUsable) {
  LOCUS_REQUIRE_GPU();
  const int64_t huge = int64_t{1} << 50;  // 1 PiB
  expect_error([&] { Tensor::empty({huge}, DType::kU8, kDev, 1); },
               {"out of memory", std::to_string(huge) + " bytes", "cuda:0", "domain 1"});
  Tensor ok = Tensor::zeros({64}, DType::kFP32, kDev, 1);
  EXPECT_EQ(rel_error(ok, std::vector<double>(64, 0.0)), 0.0);
}

TEST(CudaAllocator, PoisonedAllocationsAreNanAlsoWhenReused) {
  LOCUS_REQUIRE_GPU();
  auto all_nan = [](const Tensor& t) {
    for (double v : to_doubles(t))
      if (!std::isnan(v)) return false;
    return true;
  };
  { Tensor::zeros({777}, DType::kBF16, kDev); }  // a zeroed block in the cache
  ScopedPoisonedAllocations poison;
  EXPECT_TRUE(all_nan(Tensor::empty({777}, DType::kBF16, kDev)));  // the reused, zeroed block
  EXPECT_TRUE(all_nan(Tensor::empty({3, 5000}, DType::kFP32, kDev)));
}

// A miss inside a capture allocates in relaxed capture mode: the capture stays valid, the graph
// writes into the block, and releasing the cache is refused until the capture ends.
TEST(CudaAllocator, MissInsideAGraphCaptureKeepsTheCapture) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 3, K = 320, N = 448;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Tensor x = randn({M, K}, DType::kBF16, seed), w = randn({N, K}, DType::kBF16, seed + 1, 0.05);
  const Tensor xd = to_gpu(x), wd = to_gpu(w);
  {
    Tensor warm = Tensor::empty({M, N}, DType::kBF16, kDev);
    cuda::gemm(xd, wd, {}, warm, stream);  // the tactic is chosen outside the capture
    cuda::device_synchronize(0);
  }
  release_device_cache(kDev);
  { Tensor::empty({int64_t{64} << 20}, DType::kU8, kDev); }  // one cached block, not of y's class
  const int64_t misses = device_cache_stats(kDev, -1).misses;
  const int64_t cached = device_cache_total(kDev).cached_bytes;

  cuda::Graph graph;
  graph.begin_capture(stream);
  Tensor y = Tensor::empty({M, N}, DType::kBF16, kDev);  // a miss: cudaMalloc during the capture
  cuda::gemm(xd, wd, {}, y, stream);
  EXPECT_EQ(release_device_cache(kDev), 0);  // would wait for the device: refused
  graph.end_capture();
  ASSERT_TRUE(graph.ready());
  EXPECT_EQ(device_cache_stats(kDev, -1).misses, misses + 1);
  EXPECT_EQ(device_cache_total(kDev).cached_bytes, cached);

  y.fill_nan_();
  graph.replay(stream);
  EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w)), bf16_gemm_tolerance(K));
  EXPECT_GE(release_device_cache(kDev), int64_t{64} << 20);
  cudaStreamDestroy(stream);
}

// Rule 1 of cuda_hooks.cpp: a temporary freed right after its kernels were queued is handed to
// the next allocation at once; stream order keeps every result right.
TEST(CudaAllocator, ImmediateReuseOnOneStreamKeepsResultsRight) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 8, K = 512, I = 256, rounds = 6;
  release_device_cache(kDev);  // no older blocks of these classes: each round reuses the last one's
  const Tensor w = randn({2 * I, K}, DType::kBF16, seed, 0.05), wd = to_gpu(w);
  std::vector<Tensor> xs, xds, outs;
  std::vector<const void*> scratch;
  for (int64_t r = 0; r < rounds; ++r) {
    xs.push_back(randn({M, K}, DType::kBF16, seed + 1 + r));
    xds.push_back(to_gpu(xs[r]));
    outs.push_back(poisoned_gpu({M, I}, DType::kBF16));
  }
  // No copy (which would wait for the device) between the rounds: each round's scratch is the
  // block the previous round freed while its kernels may still be queued.
  for (int64_t r = 0; r < rounds; ++r) {
    Tensor gate_up = Tensor::empty({M, 2 * I}, DType::kFP32, kDev);
    scratch.push_back(gate_up.data_ptr());
    cuda::gemm(xds[r], wd, {}, gate_up, nullptr);
    cuda::swiglu(gate_up, outs[r], nullptr);
  }
  EXPECT_EQ(scratch.front(), scratch.back());  // the same block every round
  for (int64_t r = 0; r < rounds; ++r) {
    const auto gu = ref_gemm(xs[r], w);
    EXPECT_LT(rel_error(fetch(outs[r]), ref_swiglu(gu, M, I)), 2 * bf16_gemm_tolerance(K)) << "round " << r;
  }
}

}  // namespace
}  // namespace locus::testing
