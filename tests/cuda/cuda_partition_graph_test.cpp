// Partitioned execution on emulated locality domains (green-context SM partitions, one stream
// each, event fork/join), and CUDA graph capture/replay across them with in-place weight reload.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

class CudaPartitions : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    parts_ = cuda::create_sm_partitions(0, 2, cuda::SplitMode::kBackfill);
    ASSERT_EQ(cudaStreamCreateWithFlags(&caller_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (caller_) cudaStreamDestroy(caller_);
    cuda::destroy_sm_partitions(parts_);
  }
  std::vector<void*> streams() const { return {parts_[0].stream, parts_[1].stream}; }

  std::vector<cuda::SmPartition> parts_;
  cudaStream_t caller_ = nullptr;
};

// Copies a host tensor into an existing device tensor (same pointer).
void rewrite(const Tensor& dst, const Tensor& host) {
  Tensor d = dst;
  d.copy_(host);
}

TEST_F(CudaPartitions, PartitionedGemmMatchesUnpartitionedAndReplaysAfterReload) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t M = 6, N = 192, K = 256, n0 = 96;
  Tensor x = randn({M, K}, DType::kBF16, seed);
  Tensor w = randn({N, K}, DType::kBF16, seed + 1, 0.05);
  Tensor xg = to_gpu(x);
  // One shard per domain, allocated in (tagged with) that domain.
  Tensor shard0 = w.slice(0, 0, n0).to(Device::cuda(0), 0), shard1 = w.slice(0, n0, N).to(Device::cuda(0), 1);
  Tensor y = poisoned_gpu({M, N}, DType::kBF16);
  auto run = [&] {
    cuda::fork_streams(caller_, streams());
    cuda::gemm(xg, shard0, {}, y.slice(1, 0, n0), parts_[0].stream);
    cuda::gemm(xg, shard1, {}, y.slice(1, n0, N), parts_[1].stream);
    cuda::join_streams(caller_, streams());
  };
  run();  // eager (also tunes the tactics outside the capture)
  Tensor y_part = fetch(y);
  EXPECT_LT(rel_error(y_part, ref_gemm(x, w)), bf16_gemm_tolerance(K));
  Tensor y_full = poisoned_gpu({M, N}, DType::kBF16);
  cuda::gemm(xg, to_gpu(w), {}, y_full, caller_);
  EXPECT_LT(rel_error(y_part, to_doubles(fetch(y_full))), bf16_gemm_tolerance(K));

  cuda::Graph graph;
  graph.begin_capture(caller_);
  run();
  graph.end_capture();
  y.fill_nan_();
  graph.replay(caller_);
  EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w)), bf16_gemm_tolerance(K));

  // Reload new weights into the same shard buffers; the graph must pick them up.
  Tensor w2 = randn({N, K}, DType::kBF16, seed + 5, 0.05);
  void* p0 = shard0.data_ptr();
  rewrite(shard0, w2.slice(0, 0, n0).clone());
  rewrite(shard1, w2.slice(0, n0, N).clone());
  EXPECT_EQ(shard0.data_ptr(), p0);
  y.fill_nan_();
  graph.replay(caller_);
  EXPECT_LT(rel_error(fetch(y), ref_gemm(x, w2)), bf16_gemm_tolerance(K));
}

TEST_F(CudaPartitions, PartitionedNvfp4AndSwigluInAGraph) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t M = 4, I = 64, K = 512;
  // Fused gate/up weight split so each partition holds matching gate and up rows.
  ops::Nvfp4Weight g0 = random_nvfp4(2 * (I / 2), K, seed), g1 = random_nvfp4(2 * (I / 2), K, seed + 1);
  g1.global_scale = g0.global_scale;
  ops::Nvfp4Weight d0 = cuda::nvfp4_prepare(g0, 0, 0), d1 = cuda::nvfp4_prepare(g1, 0, 1);
  Tensor x = randn({M, K}, DType::kBF16, seed + 2);
  Tensor xg = to_gpu(x);
  Tensor y = poisoned_gpu({M, I}, DType::kBF16);
  cuda::Graph graph;
  graph.begin_capture(caller_);
  cuda::fork_streams(caller_, streams());
  cuda::nvfp4_gemm_swiglu(xg, d0, y.slice(1, 0, I / 2), parts_[0].stream);
  cuda::nvfp4_gemm_swiglu(xg, d1, y.slice(1, I / 2, I), parts_[1].stream);
  cuda::join_streams(caller_, streams());
  graph.end_capture();
  auto reference = [&](const ops::Nvfp4Weight& a, const ops::Nvfp4Weight& b) {
    auto ra = ref_swiglu(ref_gemm_dense(x, dequant_ref(a), I), M, I / 2);
    auto rb = ref_swiglu(ref_gemm_dense(x, dequant_ref(b), I), M, I / 2);
    std::vector<double> out(static_cast<size_t>(M * I));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < I / 2; ++i) {
        out[m * I + i] = ra[m * (I / 2) + i];
        out[m * I + I / 2 + i] = rb[m * (I / 2) + i];
      }
    return out;
  };
  graph.replay(caller_);
  EXPECT_LT(rel_error(fetch(y), reference(g0, g1)), bf16_gemm_tolerance(K));
  // In-place reload, global scale included.
  ops::Nvfp4Weight n0 = random_nvfp4(I, K, seed + 3), n1 = random_nvfp4(I, K, seed + 4);
  n1.global_scale = n0.global_scale;
  cuda::nvfp4_prepare_into(n0, d0);
  cuda::nvfp4_prepare_into(n1, d1);
  y.fill_nan_();
  graph.replay(caller_);
  EXPECT_LT(rel_error(fetch(y), reference(n0, n1)), bf16_gemm_tolerance(K));
}

TEST_F(CudaPartitions, PartitionedBmmOverHeads) {
  const uint64_t seed = fresh_seed();
  const int64_t B = 6, T = 3, K = 64, N = 32;
  Tensor a = randn({B, T, K}, DType::kBF16, seed);
  Tensor b = randn({B, K, N}, DType::kBF16, seed + 1, 0.1);
  Tensor ag = to_gpu(a), bg = to_gpu(b);
  Tensor y = poisoned_gpu({B, T, N}, DType::kBF16), y_full = poisoned_gpu({B, T, N}, DType::kBF16);
  cuda::bmm(ag, bg, y_full, caller_);
  cuda::fork_streams(caller_, streams());
  cuda::bmm(ag.slice(0, 0, 3), bg.slice(0, 0, 3), y.slice(0, 0, 3), parts_[0].stream);
  cuda::bmm(ag.slice(0, 3, B), bg.slice(0, 3, B), y.slice(0, 3, B), parts_[1].stream);
  cuda::join_streams(caller_, streams());
  EXPECT_LT(rel_error(fetch(y), to_doubles(fetch(y_full))), bf16_gemm_tolerance(K));
}

TEST_F(CudaPartitions, CaptureWithoutJoinIsAnError) {
  Tensor x = Tensor::zeros({2, 64}, DType::kBF16, Device::cuda(0));
  Tensor w = Tensor::zeros({32, 64}, DType::kBF16, Device::cuda(0));
  Tensor y = Tensor::zeros({2, 32}, DType::kBF16, Device::cuda(0));
  cuda::gemm(x, w, {}, y, parts_[0].stream);  // tactic chosen outside the capture
  cuda::device_synchronize(0);
  cuda::Graph graph;
  graph.begin_capture(caller_);
  cuda::fork_streams(caller_, streams());
  cuda::gemm(x, w, {}, y, parts_[0].stream);  // work on a forked stream that is never joined
  EXPECT_THROW(graph.end_capture(), Error);
  EXPECT_FALSE(graph.ready());
  cudaGetLastError();
}

}  // namespace
}  // namespace locus
