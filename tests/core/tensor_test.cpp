#include <gtest/gtest.h>

#include <cmath>

#include "core/device_hooks.h"
#include "core/tensor.h"

namespace locus {
namespace {

TEST(Tensor, SliceKeepsStridesAndSharesStorage) {
  Tensor t = Tensor::empty({4, 6}, DType::kFP32);
  float* p = t.data<float>();
  for (int i = 0; i < 24; ++i) p[i] = static_cast<float>(i);
  Tensor s = t.slice(1, 2, 5);
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_EQ(s.stride(0), 6);
  EXPECT_EQ(s.stride(1), 1);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_TRUE(s.is_row_major_2d());
  EXPECT_EQ(s.data<float>()[0], 2.f);
  EXPECT_EQ(s.storage(), t.storage());
  Tensor c = s.clone();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.data<float>()[3], 8.f);  // row 1, col 0 of the slice = element 6 + 2
}

TEST(Tensor, CopyIntoSliceWritesOnlyTheSlice) {
  Tensor t = Tensor::zeros({3, 5}, DType::kFP32);
  Tensor src = Tensor::empty({3, 2}, DType::kFP32);
  for (int i = 0; i < 6; ++i) src.data<float>()[i] = 1.f + i;
  t.slice(1, 1, 3).copy_(src);
  const float* p = t.data<float>();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 5; ++c) {
      float want = (c == 1 || c == 2) ? 1.f + r * 2 + (c - 1) : 0.f;
      EXPECT_EQ(p[r * 5 + c], want) << r << "," << c;
    }
}

TEST(Tensor, FillNanPoisonsViews) {
  Tensor t = Tensor::zeros({2, 4}, DType::kFP32);
  t.slice(1, 0, 2).fill_nan_();
  EXPECT_TRUE(std::isnan(t.data<float>()[0]));
  EXPECT_TRUE(std::isnan(t.data<float>()[5]));
  EXPECT_EQ(t.data<float>()[2], 0.f);
}

TEST(Tensor, MemoryAccountingTracksDomains) {
  int64_t before = memory_stats(Device::cpu(), 3).live_bytes;
  {
    Tensor t = Tensor::empty({1024}, DType::kBF16, Device::cpu(), 3);
    EXPECT_EQ(memory_stats(Device::cpu(), 3).live_bytes, before + 2048);
  }
  EXPECT_EQ(memory_stats(Device::cpu(), 3).live_bytes, before);
}

TEST(Tensor, AllocationsNamingNoDomainTakeTheScopesWhileItLives) {
  EXPECT_EQ(Tensor::empty({4}, DType::kFP32).domain(), -1);
  {
    AllocationDomainScope scope(7);
    EXPECT_EQ(Tensor::empty({4}, DType::kFP32).domain(), 7);
    EXPECT_EQ(Tensor::empty({4}, DType::kFP32, Device::cpu(), 2).domain(), 2);  // named: kept
    {
      AllocationDomainScope inner(9);
      EXPECT_EQ(Tensor::zeros({4}, DType::kFP32).domain(), 9);
    }
    EXPECT_EQ(Tensor::empty({4}, DType::kFP32).domain(), 7);
  }
  EXPECT_EQ(Tensor::empty({4}, DType::kFP32).domain(), -1);
}

TEST(Tensor, ErrorsNameTheProblem) {
  Tensor t = Tensor::empty({2, 3}, DType::kFP32);
  try {
    t.slice(1, 0, 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos);
  }
  EXPECT_THROW(t.slice(1, 0, 2).view({6}), Error);
  EXPECT_THROW(dtype_from_name("int3"), Error);
}

}  // namespace
}  // namespace locus
