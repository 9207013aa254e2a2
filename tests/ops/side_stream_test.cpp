// ops::SideStream on the CPU: the side work runs at once on the caller's stream, in the order it
// is queued, and nothing may be queued after the join. (tests/cuda/cuda_side_stream_test.cpp
// checks the CUDA form's ordering, eagerly and in a graph.)
#include "ops/side_stream.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"

namespace locus {
namespace {

TEST(SideStream, OnTheCpuRunsAtOnceOnTheCallersStream) {
  int pool = 0;  // stands in for a worker pool: only its address matters
  const Stream caller = Stream::cpu(&pool);
  std::vector<int> order;
  ops::SideStream side(caller);
  side.run([&](const Stream& s) {
    EXPECT_TRUE(s.device.is_cpu());
    EXPECT_EQ(s.native, &pool);
    order.push_back(1);
  });
  order.push_back(2);
  side.run([&](const Stream&) { order.push_back(3); });
  side.join();
  side.join();  // idempotent
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_THROW(side.run([](const Stream&) {}), Error);
}

}  // namespace
}  // namespace locus
