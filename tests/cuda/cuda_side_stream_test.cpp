// ops::SideStream on CUDA: side work starts after the caller's queued work, the caller's work
// after join() waits for the side's, and the side's allocations come from its own pool; eagerly
// and in a captured graph, over buffers large enough (16 M values) that a missing wait would
// let a kernel read its input before it is written. Every buffer is poisoned (NaN) first.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "ops/norm.h"
#include "ops/side_stream.h"

namespace locus::testing {
namespace {

TEST(CudaSideStream, EachSideWaitsForTheWorkQueuedBeforeIt) {
  LOCUS_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const int64_t n = int64_t{1} << 24;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const Tensor a_cpu = randn({n}, DType::kBF16, seed);
  // The chain on the CPU: b = a + a on the caller, mid = b + a on the side, out = mid + a.
  Tensor b_cpu = Tensor::empty({n}, DType::kBF16), mid_cpu = Tensor::empty({n}, DType::kBF16);
  Tensor want = Tensor::empty({n}, DType::kBF16);
  ops::add(a_cpu, a_cpu, b_cpu);
  ops::add(b_cpu, a_cpu, mid_cpu);
  ops::add(mid_cpu, a_cpu, want);

  const Tensor a = to_gpu(a_cpu);
  Tensor b = poisoned_gpu({n}, DType::kBF16), mid = poisoned_gpu({n}, DType::kBF16);
  Tensor out = poisoned_gpu({n}, DType::kBF16);
  void* native = cuda::create_capture_stream(0);
  const Stream stream{dev, native};
  int side_domain = -2;
  auto chain = [&] {
    ops::add(a, a, b, stream);
    ops::SideStream side(stream);
    side.run([&](const Stream& s) {
      EXPECT_NE(s.native, stream.native);
      side_domain = Tensor::empty({8}, DType::kBF16, dev).domain();
      ops::add(b, a, mid, s);
    });
    side.join();
    ops::add(mid, a, out, stream);
  };
  chain();
  EXPECT_TRUE(bitwise_equal(fetch(out), want)) << "eager";
  EXPECT_EQ(side_domain, ops::kSideStreamDomain);
  EXPECT_EQ(Tensor::empty({8}, DType::kBF16, dev).domain(), -1);  // the scope ended with run()

  cuda::Graph graph;
  graph.begin_capture(native);
  chain();
  graph.end_capture();
  for (int replay = 0; replay < 3; ++replay) {
    for (Tensor t : {b, mid, out}) t.fill_nan_();
    graph.replay(native);
    EXPECT_TRUE(bitwise_equal(fetch(out), want)) << "replay " << replay;
  }
  graph = cuda::Graph();
  cuda::destroy_stream(native);
}

}  // namespace
}  // namespace locus::testing
