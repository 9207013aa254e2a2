// PartitionedLayout: ranges for even and odd splits, padding refusals, argument checks.
#include "locality/layout.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace locus::locality {
namespace {

std::vector<std::pair<int64_t, int64_t>> ranges(const PartitionedLayout& l) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& r : l.parts) out.emplace_back(r.n0, r.n1);
  return out;
}

using R = std::vector<std::pair<int64_t, int64_t>>;

TEST(PartitionedLayout, DeepSeekHiddenSplitTwoThreeFour) {
  std::string why = "stale";
  auto two = make_partitioned_layout(7168, 2, 16, false, &why);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(why, "");
  EXPECT_EQ(ranges(*two), (R{{0, 3584}, {3584, 7168}}));
  EXPECT_EQ(two->describe(), "2 x [0,3584) [3584,7168)");

  // 448 blocks of 16 over 3 partitions: 150, 149, 149 blocks (the first takes the extra one).
  auto three = make_partitioned_layout(7168, 3, 16, false, &why);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(ranges(*three), (R{{0, 2400}, {2400, 4784}, {4784, 7168}}));

  auto four = make_partitioned_layout(7168, 4, 16, false, &why);
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(ranges(*four), (R{{0, 1792}, {1792, 3584}, {3584, 5376}, {5376, 7168}}));

  // NVFP4 128-row alignment: 56 blocks over 3 partitions: 19, 19, 18 blocks.
  auto three_nvfp4 = make_partitioned_layout(7168, 3, 128, false, &why);
  ASSERT_TRUE(three_nvfp4.has_value());
  EXPECT_EQ(ranges(*three_nvfp4), (R{{0, 2432}, {2432, 4864}, {4864, 7168}}));
}

TEST(PartitionedLayout, ScaleRowsFollowWeightRows) {
  auto l = make_partitioned_layout(1024, 3, 128, false, nullptr);
  ASSERT_TRUE(l.has_value());
  for (const auto& r : l->parts) {
    EXPECT_EQ(r.scale_row0, r.n0);
    EXPECT_EQ(r.scale_row1, r.n1);
  }
}

TEST(PartitionedLayout, NotDivisibleNeedsPaddingAndIsRefused) {
  std::string why;
  EXPECT_FALSE(make_partitioned_layout(7170, 2, 16, false, &why).has_value());
  EXPECT_EQ(why, "N=7170 is not a multiple of the 16-row alignment (the split would need padding)");
  EXPECT_FALSE(make_partitioned_layout(7200, 2, 128, false, &why).has_value());
  EXPECT_NE(why.find("N=7200"), std::string::npos) << why;
  EXPECT_NE(why.find("128-row"), std::string::npos) << why;
  // A split without padding into unequal shares is fine: 7 rows, align 1, 3 partitions.
  auto seven = make_partitioned_layout(7, 3, 1, false, &why);
  ASSERT_TRUE(seven.has_value());
  EXPECT_EQ(ranges(*seven), (R{{0, 3}, {3, 5}, {5, 7}}));
}

TEST(PartitionedLayout, AlignLargerThanNOrTooFewBlocks) {
  std::string why;
  EXPECT_FALSE(make_partitioned_layout(8, 2, 16, false, &why).has_value());
  EXPECT_EQ(why, "N=8 is not a multiple of the 16-row alignment (the split would need padding)");
  EXPECT_FALSE(make_partitioned_layout(16, 2, 16, false, &why).has_value());
  EXPECT_EQ(why, "N=16 splits into 1 block of 16 rows, fewer than the 2 partitions (a partition would be empty)");
  EXPECT_FALSE(make_partitioned_layout(48, 4, 16, false, &why).has_value());
  EXPECT_EQ(why, "N=48 splits into 3 blocks of 16 rows, fewer than the 4 partitions (a partition would be empty)");
  auto exact = make_partitioned_layout(48, 3, 16, false, &why);
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(ranges(*exact), (R{{0, 16}, {16, 32}, {32, 48}}));
}

TEST(PartitionedLayout, EveryValidSplitTilesExactlyAndStaysAligned) {
  for (int64_t align : {1, 16, 32, 128}) {
    for (int parts = 1; parts <= 5; ++parts) {
      for (int64_t blocks = parts; blocks <= parts + 9; ++blocks) {
        const int64_t n = blocks * align;
        auto l = make_partitioned_layout(n, parts, align, false, nullptr);
        ASSERT_TRUE(l.has_value()) << n << " / " << parts << " / " << align;
        ASSERT_EQ(l->num_partitions(), parts);
        int64_t at = 0, prev_rows = l->parts[0].rows();
        for (const auto& r : l->parts) {
          EXPECT_EQ(r.n0, at);
          EXPECT_GT(r.rows(), 0);
          EXPECT_EQ(r.rows() % align, 0);
          EXPECT_LE(r.rows(), prev_rows);  // the first partitions take the extra blocks
          EXPECT_LE(l->parts[0].rows() - r.rows(), align);
          prev_rows = r.rows();
          at = r.n1;
        }
        EXPECT_EQ(at, n);
      }
    }
  }
}

TEST(PartitionedLayout, FusedGateUpPairsRows) {
  auto l = make_partitioned_layout(18432, 2, 16, true, nullptr);
  ASSERT_TRUE(l.has_value());
  EXPECT_TRUE(l->fused_gate_up);
  EXPECT_EQ(l->n, 18432);
  EXPECT_EQ(ranges(*l), (R{{0, 9216}, {9216, 18432}}));
  EXPECT_EQ(l->weight_rows(0), 2 * 9216);
  EXPECT_EQ(l->describe(), "2 x [0,9216) [9216,18432) (each with its gate and up rows)");
}

TEST(PartitionedLayout, NonsenseArgumentsThrow) {
  EXPECT_THROW(make_partitioned_layout(0, 2, 16, false, nullptr), Error);
  EXPECT_THROW(make_partitioned_layout(64, 0, 16, false, nullptr), Error);
  EXPECT_THROW(make_partitioned_layout(64, 2, 0, false, nullptr), Error);
  try {
    make_partitioned_layout(-5, 2, 16, false, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace locus::locality
