// The CUDA routing kernel's integer key (backends/cuda/moe_route_order.h), checked on the CPU:
// ordering (score, expert) pairs by (key, then lower index) is the routing's order (ranks_before)
// for every pair of values, the special ones (NaN, infinities, signed zeros, denormals) included.
#include "backends/cuda/moe_route_order.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "test_util.h"

namespace locus::cuda::detail {
namespace {

bool key_ranks_before(float va, int ia, float vb, int ib) {
  const uint32_t ka = route_order_key(va), kb = route_order_key(vb);
  return ka != kb ? ka > kb : ia < ib;
}

TEST(MoeRouteOrder, TheKeyOrdersPairsAsTheRoutingDoes) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float denorm = std::numeric_limits<float>::denorm_min();
  std::vector<float> values = {nan,  -nan,    inf,   -inf,  0.f,     -0.f,     denorm, -denorm, 1.f,
                               -1.f, 1e-30f, -1e-30f, 3e38f, -3e38f, 0.5f, std::nextafter(0.5f, 1.f)};
  const uint64_t seed = locus::testing::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (int i = 0; i < 200; ++i) values.push_back(normal(rng));
  for (int i = 0; i < 50; ++i) values.push_back(f32_from_bits(static_cast<uint32_t>(rng())));  // any bits
  for (float a : values)
    for (float b : values)
      for (auto [ia, ib] : {std::pair{3, 7}, std::pair{7, 3}, std::pair{5, 5}}) {
        ASSERT_EQ(key_ranks_before(a, ia, b, ib), ranks_before(a, ia, b, ib))
            << a << " (expert " << ia << ") against " << b << " (expert " << ib << ")";
      }
  // NaN ranks after every number, and no number has NaN's key.
  EXPECT_EQ(route_order_key(nan), 0u);
  EXPECT_GT(route_order_key(-inf), 0u);
  EXPECT_EQ(route_order_key(-0.f), route_order_key(0.f));
}

}  // namespace
}  // namespace locus::cuda::detail
