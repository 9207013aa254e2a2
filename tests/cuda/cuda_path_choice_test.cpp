// The timed choice between code paths (backends/cuda/path_choice.h): the faster path is found
// once, remembered and then run alone; inside a capture an unknown problem takes the first path
// and is not remembered.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/path_choice.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

TEST(CudaPathChoice, TimesOnceThenRunsTheFasterPath) {
  LOCUS_REQUIRE_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Tensor buf = Tensor::empty({64 << 20}, DType::kU8, Device::cuda(0));
  int calls[2] = {0, 0};
  // Path 1 writes 64 MB 8 times, path 0 writes 1 MB once: path 0 is much faster.
  const std::vector<std::function<void()>> paths = {
      [&] {
        ++calls[0];
        ASSERT_EQ(cudaMemsetAsync(buf.data_ptr(), 0, 1 << 20, s), cudaSuccess);
      },
      [&] {
        ++calls[1];
        for (int i = 0; i < 8; ++i) ASSERT_EQ(cudaMemsetAsync(buf.data_ptr(), i, 64 << 20, s), cudaSuccess);
      }};
  const std::string key = "path-choice-test:" + std::to_string(fresh_seed());
  EXPECT_EQ(cuda::detail::chosen_path(key), -1);
  cuda::detail::run_fastest_path(key, paths, s);
  EXPECT_EQ(cuda::detail::chosen_path(key), 0);
  EXPECT_EQ(calls[0], 5);  // timed 4 times, then run
  EXPECT_EQ(calls[1], 4);
  // The fast path listed second is found too.
  const std::string key2 = key + ":swapped";
  cuda::detail::run_fastest_path(key2, {paths[1], paths[0]}, s);
  EXPECT_EQ(cuda::detail::chosen_path(key2), 1);
  calls[0] = calls[1] = 0;
  cuda::detail::run_fastest_path(key, paths, s);
  EXPECT_EQ(calls[0], 1);
  EXPECT_EQ(calls[1], 0);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

TEST(CudaPathChoice, UnknownProblemInsideACaptureTakesTheFirstPathUntimed) {
  LOCUS_REQUIRE_GPU();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Tensor buf = Tensor::empty({1 << 20}, DType::kU8, Device::cuda(0));
  int calls[2] = {0, 0};
  const std::vector<std::function<void()>> paths = {
      [&] {
        ++calls[0];
        ASSERT_EQ(cudaMemsetAsync(buf.data_ptr(), 1, 1 << 20, s), cudaSuccess);
      },
      [&] {
        ++calls[1];
        ASSERT_EQ(cudaMemsetAsync(buf.data_ptr(), 2, 1 << 20, s), cudaSuccess);
      }};
  const std::string key = "path-choice-capture:" + std::to_string(fresh_seed());
  cuda::Graph graph;
  graph.begin_capture(s);
  cuda::detail::run_fastest_path(key, paths, s);
  graph.end_capture();
  EXPECT_EQ(calls[0], 1);
  EXPECT_EQ(calls[1], 0);
  EXPECT_EQ(cuda::detail::chosen_path(key), -1) << "a choice made inside a capture is not remembered";
  graph.replay(s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace locus
