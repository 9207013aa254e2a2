// Partitioned ops on the CPU: with 1, 2, 3 and 4 emulated domains the result equals the
// unpartitioned op BIT FOR BIT (outputs poisoned first), only the output slice is written, and
// bad slices or shards are rejected naming the partition.
#include "ops/partitioned.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "locality/domain_place.h"
#include "locality/planner.h"
#include "locality/shards.h"
#include "ops/bmm.h"
#include "ops/gemm.h"
#include "ops/nvfp4.h"
#include "test_util.h"

namespace locus::locality {
namespace {

using testing::bitwise_equal;
using testing::fresh_seed;
using testing::randn;

LocalityDomainPolicy on() {
  LocalityDomainPolicy p;
  p.enabled = true;
  return p;
}

// The runtime and plan for `domains` emulated CPU domains (2 threads each). One domain gives a
// disabled plan, so a 1-partition layout is used directly there.
struct Domains {
  explicit Domains(int domains) : rt(cpu_topology(2 * domains, domains, "test")), planner(on(), rt.topology()) {}
  PartitionedLayout linear(int64_t k, int64_t n, QuantKind q, WeightMode mode) const {
    Plan plan = planner.plan_linear("test.proj", k, n, q, mode);
    if (rt.num_domains() == 1) {
      EXPECT_FALSE(plan.enabled);
      return *make_partitioned_layout(n, 1, 1, mode == WeightMode::kFusedGateUp, nullptr);
    }
    EXPECT_TRUE(plan.enabled) << plan.reason;
    return plan.layout;
  }
  LocalityRuntime rt;
  Planner planner;
};

std::vector<Tensor> dense_shards(const Tensor& w, const PartitionedLayout& l, const LocalityRuntime& rt) {
  std::vector<Tensor> out;
  for (int p = 0; p < l.num_partitions(); ++p) out.push_back(make_dense_shard(w, l, p, rt.place_for_partition(p)));
  return out;
}

std::vector<ops::Nvfp4Weight> nvfp4_shards(const ops::Nvfp4Weight& w, const PartitionedLayout& l,
                                           const LocalityRuntime& rt) {
  std::vector<ops::Nvfp4Weight> out;
  for (int p = 0; p < l.num_partitions(); ++p) out.push_back(make_nvfp4_shard(w, l, p, rt.place_for_partition(p)));
  return out;
}


// Every element of the columns outside [c0, c1) of `wide` is still NaN (never written).
bool outside_still_poisoned(const Tensor& wide, int64_t c0, int64_t c1) {
  for (int64_t i = 0; i < wide.size(0); ++i) {
    for (int64_t j = 0; j < wide.size(1); ++j) {
      if (j >= c0 && j < c1) continue;
      if (!std::isnan(testing::get(wide, i * wide.size(1) + j))) return false;
    }
  }
  return true;
}

class PartitionedOps : public ::testing::TestWithParam<int> {};

TEST_P(PartitionedOps, GemmEqualsUnpartitionedBitForBit) {
  Domains s(GetParam());
  const int64_t m = 5, k = 72, n = 7 * 16;  // 7 blocks of 16 rows: uneven for 2, 3 and 4 partitions
  for (DType out : {DType::kBF16, DType::kFP32}) {
    SCOPED_TRACE(dtype_name(out));
    Tensor x = randn({m, k}, DType::kBF16, fresh_seed());
    Tensor w = randn({n, k}, DType::kBF16, fresh_seed(), 0.1);
    Tensor bias = randn({n}, DType::kFP32, fresh_seed());
    PartitionedLayout l = s.linear(k, n, QuantKind::kBF16, WeightMode::kVanilla);
    Tensor ref = Tensor::empty({m, n}, out);
    ref.fill_nan_();
    ops::gemm(x, w, bias, ref);
    EXPECT_LT(testing::rel_error(ref, testing::ref_gemm(x, w, bias)),
              out == DType::kBF16 ? testing::bf16_gemm_tolerance(k) : testing::fp32_out_gemm_tolerance(k));
    // The output is itself a column slice of a wider poisoned buffer.
    Tensor wide = Tensor::empty({m, n + 24}, out);
    wide.fill_nan_();
    Tensor y = wide.slice(1, 8, 8 + n);
    ops::gemm_partitioned(x, dense_shards(w, l, s.rt), bias, y, partition_slices(l, s.rt));
    EXPECT_TRUE(bitwise_equal(y, ref));
    EXPECT_TRUE(outside_still_poisoned(wide, 8, 8 + n));
    // No bias.
    ops::gemm(x, w, Tensor(), ref);
    y.fill_nan_();
    ops::gemm_partitioned(x, dense_shards(w, l, s.rt), Tensor(), y, partition_slices(l, s.rt));
    EXPECT_TRUE(bitwise_equal(y, ref));
  }
}

TEST_P(PartitionedOps, GemmSwigluEqualsUnpartitionedBitForBit) {
  Domains s(GetParam());
  const int64_t m = 4, k = 64, inter = 5 * 16;
  Tensor x = randn({m, k}, DType::kBF16, fresh_seed());
  Tensor w = randn({2 * inter, k}, DType::kBF16, fresh_seed(), 0.2);
  PartitionedLayout l = s.linear(k, inter, QuantKind::kBF16, WeightMode::kFusedGateUp);
  Tensor ref = Tensor::empty({m, inter}, DType::kBF16);
  ref.fill_nan_();
  ops::gemm_swiglu(x, w, ref);
  Tensor y = Tensor::empty({m, inter}, DType::kBF16);
  y.fill_nan_();
  ops::gemm_swiglu_partitioned(x, dense_shards(w, l, s.rt), y, partition_slices(l, s.rt));
  EXPECT_TRUE(bitwise_equal(y, ref));
}

TEST_P(PartitionedOps, Nvfp4GemmEqualsUnpartitionedBitForBit) {
  Domains s(GetParam());
  const int64_t m = 3, k = 64, n = 5 * 128;  // NVFP4 partitions are 128-row multiples
  Tensor x = randn({m, k}, DType::kBF16, fresh_seed());
  ops::Nvfp4Weight w = ops::nvfp4_quantize(randn({n, k}, DType::kBF16, fresh_seed(), 0.1));
  Tensor bias = randn({n}, DType::kBF16, fresh_seed());
  PartitionedLayout l = s.linear(k, n, QuantKind::kNVFP4, WeightMode::kVanilla);
  for (DType out : {DType::kBF16, DType::kFP32}) {
    SCOPED_TRACE(dtype_name(out));
    Tensor ref = Tensor::empty({m, n}, out);
    ref.fill_nan_();
    ops::nvfp4_gemm(x, w, bias, ref);
    Tensor y = Tensor::empty({m, n}, out);
    y.fill_nan_();
    ops::nvfp4_gemm_partitioned(x, nvfp4_shards(w, l, s.rt), bias, y, partition_slices(l, s.rt));
    EXPECT_TRUE(bitwise_equal(y, ref));
  }
}

TEST_P(PartitionedOps, Nvfp4GemmSwigluEqualsUnpartitionedBitForBit) {
  Domains s(GetParam());
  const int64_t m = 2, k = 96, inter = 5 * 128;
  Tensor x = randn({m, k}, DType::kBF16, fresh_seed());
  // One quantization of the fused [gate; up] weight: gate and up share the global scale.
  ops::Nvfp4Weight w = ops::nvfp4_quantize(randn({2 * inter, k}, DType::kBF16, fresh_seed(), 0.2));
  PartitionedLayout l = s.linear(k, inter, QuantKind::kNVFP4, WeightMode::kFusedGateUp);
  Tensor ref = Tensor::empty({m, inter}, DType::kBF16);
  ref.fill_nan_();
  ops::nvfp4_gemm_swiglu(x, w, ref);
  Tensor y = Tensor::empty({m, inter}, DType::kBF16);
  y.fill_nan_();
  auto shards = nvfp4_shards(w, l, s.rt);
  for (const auto& sh : shards) EXPECT_EQ(sh.global_scale, w.global_scale);
  ops::nvfp4_gemm_swiglu_partitioned(x, shards, y, partition_slices(l, s.rt));
  EXPECT_TRUE(bitwise_equal(y, ref));
}

TEST_P(PartitionedOps, BmmOverHeadsEqualsUnpartitionedBitForBit) {
  Domains s(GetParam());
  const int64_t heads = 7, t = 3, k = 16, n = 24;
  // a: the [T, H, K] activation viewed as [H, T, K]; b: per-head [N, K] weights viewed as [H, K, N].
  Tensor act = randn({t, heads, k}, DType::kBF16, fresh_seed());
  Tensor a = act.transpose(0, 1);
  Tensor wt = randn({heads, n, k}, DType::kBF16, fresh_seed(), 0.3);
  Tensor b = wt.transpose(1, 2);
  PartitionedLayout l;
  if (GetParam() == 1) {
    l = *make_partitioned_layout(heads, 1, 1, false, nullptr);
  } else {
    Plan plan = s.planner.plan_bmm("test.bmm", heads, k, n);
    ASSERT_TRUE(plan.enabled) << plan.reason;
    l = plan.layout;
  }
  std::vector<Tensor> shards;
  for (int p = 0; p < l.num_partitions(); ++p) shards.push_back(make_bmm_shard(b, l, p, s.rt.place_for_partition(p)));
  for (DType out : {DType::kBF16, DType::kFP32}) {
    SCOPED_TRACE(dtype_name(out));
    Tensor ref = Tensor::empty({heads, t, n}, out);
    ref.fill_nan_();
    ops::bmm(a, b, ref);
    Tensor y = Tensor::empty({heads, t, n}, out);
    y.fill_nan_();
    ops::bmm_partitioned(a, shards, y, partition_slices(l, s.rt));
    EXPECT_TRUE(bitwise_equal(y, ref));
  }
}

INSTANTIATE_TEST_SUITE_P(Domains, PartitionedOps, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "domains"; });

// ---- validation ----------------------------------------------------------------------------

using locus::testing::error_text;

TEST(PartitionedOpsValidation, SlicesMustTileTheOutputInOrder) {
  LocalityRuntime rt(cpu_topology(2, 2, "test"));
  Tensor x = randn({2, 16}, DType::kBF16, fresh_seed());
  Tensor y = Tensor::empty({2, 64}, DType::kBF16);
  Stream s0 = rt.place(0).stream(), s1 = rt.place(1).stream();
  auto shards = [&](int64_t r0, int64_t r1) {
    return std::vector<Tensor>{Tensor::zeros({r0, 16}, DType::kBF16), Tensor::zeros({r1, 16}, DType::kBF16)};
  };
  auto run = [&](std::vector<ops::PartitionSlice> slices, std::vector<Tensor> sh) {
    return error_text([&] { ops::gemm_partitioned(x, sh, Tensor(), y, slices); });
  };
  EXPECT_EQ(run({{0, 32, s0}, {40, 64, s1}}, shards(32, 24)),
            "gemm_partitioned: partition 1 starts at column 40 but partition 0 ended at 32 (slices must tile [0, 64) in order)");
  EXPECT_EQ(run({{16, 32, s0}, {32, 64, s1}}, shards(16, 32)),
            "gemm_partitioned: partition 0 starts at column 16 but the first must start at 0 (slices must tile [0, 64) in order)");
  EXPECT_EQ(run({{0, 32, s0}, {32, 48, s1}}, shards(32, 16)),
            "gemm_partitioned: the slices cover [0, 48) but the output has 64 columns");
  EXPECT_EQ(run({{0, 32, s0}, {32, 32, s1}}, shards(32, 0)), "gemm_partitioned: partition 1 has an empty range [32, 32)");
  EXPECT_EQ(run({{0, 32, s0}, {32, 64, s1}}, shards(32, 16)),
            "gemm_partitioned: partition 1 shard is [16, 16] but its slice needs [32, 16]");
  EXPECT_EQ(run({{0, 32, s0}}, shards(32, 32)), "gemm_partitioned: 1 slices but 2 shards");
  EXPECT_EQ(run({}, {}), "gemm_partitioned: no partitions given");
  // A wrong bias and a wrong dtype are caught (the dtype inside the op, named with its partition).
  EXPECT_NE(error_text([&] {
              ops::gemm_partitioned(x, shards(32, 32), Tensor::zeros({63}, DType::kFP32), y,
                                    {{0, 32, s0}, {32, 64, s1}});
            }).find("bias must be [64]"),
            std::string::npos);
  const std::string dtype_err = error_text([&] {
    ops::gemm_partitioned(x, {Tensor::zeros({32, 16}, DType::kBF16), Tensor::zeros({32, 16}, DType::kFP32)}, Tensor(),
                          y, {{0, 32, s0}, {32, 64, s1}});
  });
  EXPECT_EQ(dtype_err.rfind("partition 1 of 2: ", 0), 0u) << dtype_err;
}

TEST(PartitionedOpsValidation, SwigluAndBmmShardShapes) {
  LocalityRuntime rt(cpu_topology(2, 2, "test"));
  Stream s0 = rt.place(0).stream(), s1 = rt.place(1).stream();
  Tensor x = randn({2, 16}, DType::kBF16, fresh_seed());
  Tensor y = Tensor::empty({2, 32}, DType::kBF16);
  EXPECT_EQ(error_text([&] {
              ops::gemm_swiglu_partitioned(x, {Tensor::zeros({32, 16}, DType::kBF16), Tensor::zeros({16, 16}, DType::kBF16)},
                                           y, {{0, 16, s0}, {16, 32, s1}});
            }),
            "gemm_swiglu_partitioned: partition 1 shard is [16, 16] but its slice needs [32, 16]");
  Tensor a = randn({4, 2, 8}, DType::kBF16, fresh_seed());
  Tensor yb = Tensor::empty({4, 2, 8}, DType::kBF16);
  EXPECT_EQ(error_text([&] {
              ops::bmm_partitioned(a, {Tensor::zeros({2, 8, 8}, DType::kBF16), Tensor::zeros({2, 16, 8}, DType::kBF16)}, yb,
                                   {{0, 2, s0}, {2, 4, s1}});
            }),
            "bmm_partitioned: partition 1 shard is [2, 16, 8] but its slice needs [2, 8, 8]");
  EXPECT_EQ(error_text([&] {
              ops::bmm_partitioned(a, {Tensor::zeros({2, 8, 8}, DType::kBF16), Tensor::zeros({2, 8, 8}, DType::kBF16)}, yb,
                                   {{0, 2, s0}, {2, 3, s1}});
            }),
            "bmm_partitioned: the slices cover [0, 3) but the output has 4 heads");
}

// Default-off: the planner refuses every layer with the policy reason, so modules keep the
// unpartitioned op and its result; switching LD on gives the same bits.
TEST(PartitionedOpsDefaultOff, DisabledPlansAndIdenticalResults) {
  LocalityRuntime rt(cpu_topology(4, 2, "test"));
  Planner off(LocalityDomainPolicy{}, rt.topology());
  Plan p = off.plan_linear("model.layers.0.mlp.down_proj", 64, 96, QuantKind::kBF16, WeightMode::kVanilla);
  EXPECT_FALSE(p.enabled);
  EXPECT_EQ(p.reason, "locality domains are disabled by the policy (enable with --enable-locality-domains)");
  Tensor x = randn({3, 64}, DType::kBF16, fresh_seed());
  Tensor w = randn({96, 64}, DType::kBF16, fresh_seed());
  Tensor y_off = Tensor::empty({3, 96}, DType::kBF16);
  y_off.fill_nan_();
  ops::gemm(x, w, Tensor(), y_off);
  Planner on_planner(on(), rt.topology());
  Plan q = on_planner.plan_linear("model.layers.0.mlp.down_proj", 64, 96, QuantKind::kBF16, WeightMode::kVanilla);
  ASSERT_TRUE(q.enabled) << q.reason;
  Tensor y_on = Tensor::empty({3, 96}, DType::kBF16);
  y_on.fill_nan_();
  ops::gemm_partitioned(x, dense_shards(w, q.layout, rt), Tensor(), y_on, partition_slices(q.layout, rt));
  EXPECT_TRUE(bitwise_equal(y_on, y_off));
}

}  // namespace
}  // namespace locus::locality
