// Device discovery, green-context SM partitions, and the no-GPU path.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

#include "core/device_hooks.h"
#include "ops/host_readback.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

TEST(CudaDevice, NoDevicePathGivesErrorsNotCrashes) {
  if (cuda::device_available()) GTEST_SKIP() << "a CUDA device is present; this test covers the no-GPU path";
  EXPECT_THROW(cuda::query_device(0), Error);
  EXPECT_THROW(cuda::create_sm_partitions(0, 2, cuda::SplitMode::kAligned), Error);
  EXPECT_THROW(Tensor::empty({4}, DType::kFP32, Device::cuda(0)), Error);
}

TEST(CudaDevice, QueryReportsTheDevice) {
  LOCUS_REQUIRE_GPU();
  cuda::DeviceInfo info = cuda::query_device(0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.l2_bytes, 0);
  EXPECT_GE(info.locality_domain_count, 1);
  if (info.cc_major >= 9) {
    EXPECT_GT(info.min_sm_partition, 0);
  }
  EXPECT_THROW(cuda::query_device(1000), Error);
}

void expect_disjoint_partitions(const std::vector<cuda::SmPartition>& parts, int total_sms) {
  std::set<int> all;
  for (const auto& p : parts) {
    EXPECT_GT(p.sm_count, 0);
    EXPECT_LE(static_cast<int>(p.smids.size()), p.sm_count) << "a partition ran on more SMs than it owns";
    EXPECT_GT(p.smids.size(), 0u);
    for (int s : p.smids) {
      EXPECT_LT(s, total_sms);
      EXPECT_TRUE(all.insert(s).second) << "SM " << s << " appears in two partitions";
    }
  }
}

TEST(CudaDevice, AlignedSplitGivesDisjointPartitions) {
  LOCUS_REQUIRE_GPU();
  const auto info = cuda::query_device(0);
  auto parts = cuda::create_sm_partitions(0, 2, cuda::SplitMode::kAligned);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].sm_count, parts[1].sm_count);
  EXPECT_LE(parts[0].sm_count * 2, info.sm_count);
  if (info.sm_coscheduled_alignment > 0) EXPECT_EQ(parts[0].sm_count % info.sm_coscheduled_alignment, 0);
  expect_disjoint_partitions(parts, info.sm_count);
  cuda::destroy_sm_partitions(parts);
  EXPECT_TRUE(parts.empty());
}

TEST(CudaDevice, BackfillSplitUsesEverySmOnH200) {
  LOCUS_REQUIRE_GPU();
  const auto info = cuda::query_device(0);
  auto parts = cuda::create_sm_partitions(0, 2, cuda::SplitMode::kBackfill);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].sm_count + parts[1].sm_count, info.sm_count / 2 * 2);
  expect_disjoint_partitions(parts, info.sm_count);
  cuda::destroy_sm_partitions(parts);
}

TEST(CudaDevice, ImpossibleSplitIsAClearError) {
  LOCUS_REQUIRE_GPU();
  try {
    cuda::create_sm_partitions(0, 1000, cuda::SplitMode::kAligned);
    FAIL() << "splitting into 1000 partitions should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::create_sm_partitions(0, 0, cuda::SplitMode::kAligned), Error);
}

TEST(CudaDevice, HooksCopyRoundTripAndFill) {
  LOCUS_REQUIRE_GPU();
  Tensor h = randn({37, 19}, DType::kFP32, fresh_seed());
  Tensor d = to_gpu(h);
  EXPECT_TRUE(bitwise_equal(h, d));
  // Strided (column-slice) device view round trip.
  Tensor wide = Tensor::zeros({37, 40}, DType::kFP32, Device::cuda(0));
  Tensor slice = wide.slice(1, 5, 24);
  slice.copy_(h);
  EXPECT_TRUE(bitwise_equal(h, slice.to(Device::cpu())));
  EXPECT_EQ(get(wide.to(Device::cpu()), 4), 0.0);
  const int64_t before = live_bytes_total(Device::cuda(0));
  { Tensor t = Tensor::empty({1024}, DType::kFP32, Device::cuda(0), 1); EXPECT_EQ(t.domain(), 1); }
  EXPECT_EQ(live_bytes_total(Device::cuda(0)), before);
}

// Device-to-host read-backs through pinned blocks: sizes from 4 bytes to 16 MB in flight together
// (so the pool hands out several blocks, the smallest that fits first), each bitwise equal to its
// source; a block is reused once its read-back is gone. Small ones are a kernel's copy (also from
// a source at an odd address), large ones the copy engine's. A strided source is refused.
TEST(CudaDevice, HostReadbackCopiesEveryBitAndReusesItsBlocks) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (int round = 0; round < 2; ++round) {
    std::vector<Tensor> host, dev;
    std::vector<std::unique_ptr<ops::HostReadback>> backs;
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{129280}, int64_t{4} << 20}) {
      host.push_back(randn({n}, DType::kFP32, seed + n + round));
      dev.push_back(host.back().to(Device::cuda(0)));
      backs.push_back(std::make_unique<ops::HostReadback>(dev.back()));
    }
    // 3 bf16 values 2 bytes past a 16-byte boundary: the kernel's byte-wise copy.
    host.push_back(randn({4}, DType::kBF16, seed + round).slice(0, 1, 4));
    dev.push_back(randn({4}, DType::kBF16, seed + round).to(Device::cuda(0)).slice(0, 1, 4));
    backs.push_back(std::make_unique<ops::HostReadback>(dev.back()));
    for (size_t i = 0; i < backs.size(); ++i) {
      const Tensor got = backs[i]->wait();
      EXPECT_TRUE(got.device().is_cpu());
      EXPECT_EQ(got.shape(), host[i].shape());
      EXPECT_TRUE(bitwise_equal(got, host[i])) << i;
    }
  }
  Tensor wide = Tensor::empty({4, 8}, DType::kFP32, Device::cuda(0));
  EXPECT_THROW(ops::HostReadback(wide.slice(1, 0, 4)), Error);
}

}  // namespace
}  // namespace locus
