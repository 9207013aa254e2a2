// ThreadPool: coverage of every index, error propagation, nested and concurrent calls.
#include "backends/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"

namespace locus::cpu {
namespace {

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 7, 100, 1001}) {
    for (int64_t grain : {1, 3, 64}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LE(0, b);
        EXPECT_LT(b, e);
        EXPECT_LE(e, n);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
    }
  }
  pool.parallel_for(0, 1, [](int64_t, int64_t) { FAIL() << "no work for n = 0"; });
}

TEST(ThreadPool, RethrowsTheWorkersError) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(64, 1,
                                 [](int64_t b, int64_t) {
                                   if (b >= 32) throw Error("chunk failed");
                                 }),
               Error);
  // The pool stays usable afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 45);
}

TEST(ThreadPool, NestedAndConcurrentCallsComplete) {
  ThreadPool pool(2);
  std::atomic<int64_t> count{0};
  pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(5, 1, [&](int64_t b2, int64_t e2) { count += e2 - b2; });
  });
  EXPECT_EQ(count.load(), 40);
  count = 0;
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int r = 0; r < 20; ++r) pool.parallel_for(16, 1, [&](int64_t b, int64_t e) { count += e - b; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(count.load(), 3 * 20 * 16);
  EXPECT_THROW(ThreadPool(0), Error);
}

}  // namespace
}  // namespace locus::cpu
