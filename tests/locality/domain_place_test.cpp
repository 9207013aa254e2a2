// CPU domain places, fork/join (run_partitioned) and shard building.
#include "locality/domain_place.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>

#include "backends/cpu/thread_pool.h"
#include "core/device_hooks.h"
#include "core/error.h"
#include "locality/planner.h"
#include "locality/shards.h"
#include "ops/partitioned.h"
#include "test_util.h"

namespace locus::locality {
namespace {

TEST(DomainPlace, CpuPlacesOwnTheirWorkerPools) {
  LocalityRuntime rt(cpu_topology(6, 3, "test"));
  ASSERT_EQ(rt.num_domains(), 3);
  std::set<void*> pools;
  for (int d = 0; d < 3; ++d) {
    const DomainPlace& p = rt.place(d);
    EXPECT_EQ(p.domain(), d);
    EXPECT_TRUE(p.device().is_cpu());
    EXPECT_EQ(p.units(), 2);
    ASSERT_NE(p.stream().native, nullptr);
    EXPECT_EQ(static_cast<cpu::ThreadPool*>(p.stream().native)->num_threads(), 2);
    pools.insert(p.stream().native);
  }
  EXPECT_EQ(pools.size(), 3u);
  EXPECT_EQ(rt.streams().size(), 3u);
  std::vector<Stream> five = rt.partition_streams(5);  // wraps around the domains
  ASSERT_EQ(five.size(), 5u);
  EXPECT_EQ(five[3].native, rt.place(0).stream().native);
  EXPECT_EQ(five[4].native, rt.place(1).stream().native);
}

TEST(DomainPlace, AllocationsAreTaggedWithTheDomain) {
  LocalityRuntime rt(cpu_topology(2, 2, "test"));
  const int64_t before = memory_stats(Device::cpu(), 1).live_bytes;
  {
    Tensor t = rt.place(1).allocate({64, 32}, DType::kBF16);
    EXPECT_EQ(t.domain(), 1);
    EXPECT_EQ(memory_stats(Device::cpu(), 1).live_bytes, before + 64 * 32 * 2);
  }
  EXPECT_EQ(memory_stats(Device::cpu(), 1).live_bytes, before);
}

TEST(DomainPlace, SharedRuntimeIsCreatedOnce) {
  Topology t = cpu_topology(4, 2, "test");
  auto a = shared_locality_runtime(t);
  auto b = shared_locality_runtime(t);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), shared_locality_runtime(cpu_topology(4, 4, "test")).get());
}

TEST(DomainPlace, InvalidTopologyIsRejected) {
  Topology t = cpu_topology(4, 2, "test");
  t.units_per_domain.pop_back();
  EXPECT_THROW(LocalityRuntime{t}, Error);
}

// Each partition waits until all have started: only passes if they really run concurrently.
TEST(RunPartitioned, CpuPartitionsRunConcurrentlyOnTheirOwnStreams) {
  for (int parts : {1, 2, 3, 4}) {
    LocalityRuntime rt(cpu_topology(parts, parts, "test"));
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    std::atomic<int> saw_all{0};
    std::vector<void*> seen(parts, nullptr);
    const std::vector<Stream> streams = rt.streams();
    ops::run_partitioned({}, streams, [&](int p) {
      seen[p] = streams[p].native;
      std::unique_lock<std::mutex> lock(mu);
      ++arrived;
      cv.notify_all();
      if (cv.wait_for(lock, std::chrono::seconds(20), [&] { return arrived == parts; })) ++saw_all;
    });
    EXPECT_EQ(saw_all.load(), parts);
    for (int p = 0; p < parts; ++p) EXPECT_EQ(seen[p], rt.place(p).stream().native);
  }
}

TEST(RunPartitioned, FirstErrorIsRethrownAfterAllPartitionsFinish) {
  LocalityRuntime rt(cpu_topology(3, 3, "test"));
  std::atomic<int> finished{0};
  try {
    ops::run_partitioned({}, rt.streams(), [&](int p) {
      ++finished;
      if (p >= 1) LOCUS_THROW("shard ", p, " broke");
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "partition 1 of 3: shard 1 broke");
  }
  EXPECT_EQ(finished.load(), 3);
}

TEST(RunPartitioned, BadStreamListsAreRejected) {
  EXPECT_THROW(ops::run_partitioned({}, {}, [](int) {}), Error);
  std::vector<Stream> mixed = {Stream::cpu(), Stream{Device::cuda(0), nullptr}};
  try {
    ops::run_partitioned({}, mixed, [](int) {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("partition 1 runs on cuda:0"), std::string::npos) << e.what();
  }
}

TEST(Shards, DenseFusedShardHoldsMatchingGateAndUpRows) {
  LocalityRuntime rt(cpu_topology(2, 2, "test"));
  const int64_t inter = 48, k = 8;
  Tensor w = testing::randn({2 * inter, k}, DType::kBF16, testing::fresh_seed());
  auto layout = make_partitioned_layout(inter, 2, 16, true, nullptr);
  ASSERT_TRUE(layout.has_value());  // [0,32) [32,48)
  Tensor s1 = make_dense_shard(w, *layout, 1, rt.place(1));
  ASSERT_EQ(s1.shape(), (Shape{32, k}));
  EXPECT_EQ(s1.domain(), 1);
  EXPECT_NE(s1.data_ptr(), w.slice(0, 32, 48).data_ptr());
  EXPECT_TRUE(testing::bitwise_equal(s1.slice(0, 0, 16), w.slice(0, 32, 48)));                  // gate rows
  EXPECT_TRUE(testing::bitwise_equal(s1.slice(0, 16, 32), w.slice(0, inter + 32, inter + 48)));  // up rows
  EXPECT_THROW(make_dense_shard(w.slice(0, 0, inter), *layout, 0, rt.place(0)), Error);
  EXPECT_THROW(make_dense_shard(w, *layout, 2, rt.place(0)), Error);
  auto slices = partition_slices(*layout, rt);
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(slices[1].n0, 32);
  EXPECT_EQ(slices[1].n1, 48);
  EXPECT_EQ(slices[1].stream.native, rt.place(1).stream().native);
}

TEST(Shards, BmmShardTakesHeadsFromTransposedViews) {
  LocalityRuntime rt(cpu_topology(2, 2, "test"));
  Tensor w = testing::randn({5, 16, 8}, DType::kBF16, testing::fresh_seed());  // [B, N, K]
  Tensor b = w.transpose(1, 2);                                                 // [B, K, N] view
  auto layout = make_partitioned_layout(5, 2, 1, false, nullptr);
  ASSERT_TRUE(layout.has_value());  // heads [0,3) [3,5)
  Tensor s = make_bmm_shard(b, *layout, 1, rt.place(1));
  EXPECT_EQ(s.shape(), (Shape{2, 8, 16}));
  EXPECT_EQ(s.domain(), 1);
  EXPECT_TRUE(testing::bitwise_equal(s, b.slice(0, 3, 5)));
}

}  // namespace
}  // namespace locus::locality
