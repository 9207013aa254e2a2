// The timed choice between code paths (backends/cuda/path_choice.h): the faster path is found
// once, remembered and then run alone; it is timed as a captured graph runs it, so host work in a
// path does not count, also when the caller's stream is the legacy default one (which cannot be
// captured); inside a capture an unknown problem takes the first path and is not remembered.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/path_choice.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

// A stream, a 64 MB buffer, and paths that memset it and count how often they are called.
class CudaPathChoice : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCUS_REQUIRE_GPU();
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
    buf_ = Tensor::empty({64 << 20}, DType::kU8, Device::cuda(0));
  }
  void TearDown() override {
    if (s_) {
      cudaStreamSynchronize(s_);
      cudaStreamDestroy(s_);
    }
  }
  // A path that counts its calls in calls_[i] and writes `bytes` of the buffer `times` times.
  cuda::detail::PathCall memset_path(int i, size_t bytes, int times) {
    return [this, i, bytes, times](cudaStream_t s) {
      ++calls_[i];
      for (int r = 0; r < times; ++r) ASSERT_EQ(cudaMemsetAsync(buf_.data_ptr(), r, bytes, s), cudaSuccess);
    };
  }
  // A path that spends 2 ms on the host before it writes 1 MB (counted in calls_[1]).
  cuda::detail::PathCall slow_host_path() {
    return [this](cudaStream_t s) {
      ++calls_[1];
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ASSERT_EQ(cudaMemsetAsync(buf_.data_ptr(), 1, 1 << 20, s), cudaSuccess);
    };
  }
  cudaStream_t s_ = nullptr;
  Tensor buf_;
  int calls_[2] = {0, 0};
};

TEST_F(CudaPathChoice, TimesOnceThenRunsTheFasterPath) {
  // Path 1 writes 64 MB 8 times, path 0 writes 1 MB once: path 0 is much faster.
  const std::vector<cuda::detail::PathCall> paths = {memset_path(0, 1 << 20, 1), memset_path(1, 64 << 20, 8)};
  const std::string key = "path-choice-test:" + std::to_string(fresh_seed());
  EXPECT_EQ(cuda::detail::chosen_path(key), -1);
  cuda::detail::run_fastest_path(key, paths, s_);
  EXPECT_EQ(cuda::detail::chosen_path(key), 0);
  EXPECT_EQ(calls_[0], 3);  // run once, captured once (the graph is what is timed), then run
  EXPECT_EQ(calls_[1], 2);
  // The fast path listed second is found too.
  const std::string key2 = key + ":swapped";
  cuda::detail::run_fastest_path(key2, {paths[1], paths[0]}, s_);
  EXPECT_EQ(cuda::detail::chosen_path(key2), 1);
  calls_[0] = calls_[1] = 0;
  cuda::detail::run_fastest_path(key, paths, s_);
  EXPECT_EQ(calls_[0], 1);
  EXPECT_EQ(calls_[1], 0);
}

TEST_F(CudaPathChoice, HostWorkInAPathDoesNotCount) {
  // Path 0 writes 256 MB (under 0.2 ms on any GPU this runs on); path 1 spends 2 ms on the host
  // before it writes 1 MB. Timed eagerly, path 1 would take 2 ms; a captured decode step runs
  // only its 1 MB write.
  const std::string key = "path-choice-host:" + std::to_string(fresh_seed());
  cuda::detail::run_fastest_path(key, {memset_path(0, 64 << 20, 4), slow_host_path()}, s_);
  EXPECT_EQ(cuda::detail::chosen_path(key), 1);
}

TEST_F(CudaPathChoice, OnTheLegacyDefaultStreamPathsAreStillTimedInGraphs) {
  // `locus generate` runs the model on the legacy default stream, which cannot be captured: the
  // paths are timed on a stream of the choice's own. Eagerly, the 2 ms of host work would lose.
  const std::string key = "path-choice-legacy:" + std::to_string(fresh_seed());
  cuda::detail::run_fastest_path(key, {memset_path(0, 64 << 20, 4), slow_host_path()}, nullptr);
  EXPECT_EQ(cuda::detail::chosen_path(key), 1);
  EXPECT_EQ(calls_[1], 3) << "run once, captured once, then run on the caller's stream";
  // The final run was queued on the legacy stream, after the timing: the buffer holds its write.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> head(16);
  ASSERT_EQ(cudaMemcpy(head.data(), buf_.data_ptr(), head.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint8_t b : head) EXPECT_EQ(b, 1);
}

TEST_F(CudaPathChoice, PathThatCannotBeCapturedIsTimedEagerly) {
  // Path 1 refuses to be captured: the choice is still made (eagerly), and the stream is left
  // out of capture, so that the faster path wins and a later capture works.
  const cuda::detail::PathCall uncapturable = [this](cudaStream_t s) {
    if (cuda::stream_is_capturing(s)) throw std::runtime_error("this path cannot be captured");
    ++calls_[1];
    ASSERT_EQ(cudaMemsetAsync(buf_.data_ptr(), 2, 64 << 20, s), cudaSuccess);
  };
  const std::string key = "path-choice-uncapturable:" + std::to_string(fresh_seed());
  cuda::detail::run_fastest_path(key, {memset_path(0, 1 << 20, 1), uncapturable}, s_);
  EXPECT_EQ(cuda::detail::chosen_path(key), 0);
  EXPECT_FALSE(cuda::stream_is_capturing(s_));
  EXPECT_EQ(calls_[1], 5) << "run once, then timed eagerly 4 times";
  cuda::Graph graph;
  graph.begin_capture(s_);
  cuda::detail::run_fastest_path(key, {memset_path(0, 1 << 20, 1), uncapturable}, s_);
  graph.end_capture();
  graph.replay(s_);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
}

TEST_F(CudaPathChoice, UnknownProblemInsideACaptureTakesTheFirstPathUntimed) {
  const std::vector<cuda::detail::PathCall> paths = {memset_path(0, 1 << 20, 1), memset_path(1, 1 << 20, 1)};
  const std::string key = "path-choice-capture:" + std::to_string(fresh_seed());
  cuda::Graph graph;
  graph.begin_capture(s_);
  cuda::detail::run_fastest_path(key, paths, s_);
  graph.end_capture();
  EXPECT_EQ(calls_[0], 1);
  EXPECT_EQ(calls_[1], 0);
  EXPECT_EQ(cuda::detail::chosen_path(key), -1) << "a choice made inside a capture is not remembered";
  graph.replay(s_);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
}

}  // namespace
}  // namespace locus
