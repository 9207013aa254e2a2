// The BF16 decode matrix-vector kernel's domain-aware form (bf16_gemv.h): a partitioned GEMM's
// shards in one launch over two green-context domains, against fp64 on random inputs, written
// into their columns of a poisoned tensor (the columns around stay poisoned), bitwise equal to the
// one-weight kernel on the whole weight (same blocks, same sums), the same bits on repeated calls
// and graph replays (its counters reset themselves), a replay after an in-place reload using the
// new weights; every SM in one domain (the other's rows stolen); and gemm_partitioned /
// gemm_swiglu_partitioned, which time it against the fork/join.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/domain_table.h"
#include "cuda_test_util.h"
#include "ops/partitioned.h"

namespace locus {
namespace {

using namespace locus::testing;
using cuda::detail::Bf16GemvArgs;
using cuda::detail::Bf16GemvDomainArgs;

struct DomainsCase {
  int64_t m, n, k;
  std::vector<int64_t> cuts;  // part p: rows [cuts[p], cuts[p + 1]) on domain p % 2
  DType out;
  int bias;  // 0 none, 1 bf16, 2 fp32
};

// The output sits at columns [kLeft, kLeft + n) of a poisoned [m, n + kLeft + kRight] tensor.
constexpr int64_t kLeft = 3, kRight = 5;

class CudaBf16GemvDomains : public CudaTwoDomains, public ::testing::WithParamInterface<DomainsCase> {
 protected:
  const uint8_t* sm_table() const { return cuda::detail::sm_domain_table({parts_[0].stream, parts_[1].stream}); }
};

// The arguments both kernels share: x, the bias, y at its column kLeft.
Bf16GemvArgs common_args(const Tensor& xg, const Tensor& bg, const Tensor& y, int64_t n) {
  Bf16GemvArgs a;
  a.x = xg.data_ptr();
  a.x_ld = xg.stride(0);
  a.bias = bg.defined() ? bg.data_ptr() : nullptr;
  a.bias_f32 = bg.defined() && bg.dtype() == DType::kFP32;
  a.y = static_cast<char*>(y.data_ptr()) + kLeft * dtype_size(y.dtype());
  a.y_ld = y.stride(0);
  a.y_f32 = y.dtype() == DType::kFP32;
  a.m = xg.size(0);
  a.n = n;
  a.k = xg.size(1);
  return a;
}

TEST_P(CudaBf16GemvDomains, ShardsMatchFp64AndTheWholeWeightsBitsAndReplayAfterReload) {
  const DomainsCase c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << c.m << " n " << c.n << " k " << c.k);
  const Tensor x = randn({c.m, c.k}, DType::kBF16, seed);
  const Tensor w = randn({c.n, c.k}, DType::kBF16, seed + 1, 0.05);
  Tensor bias;
  if (c.bias) bias = randn({c.n}, c.bias == 1 ? DType::kBF16 : DType::kFP32, seed + 2);
  const Tensor xg = to_gpu(x), bg = bias.defined() ? to_gpu(bias) : Tensor();
  const int64_t width = c.n + kLeft + kRight;
  Tensor y = poisoned_gpu({c.m, width}, c.out);
  const double tol = c.out == DType::kBF16 ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k);

  Bf16GemvDomainArgs a;
  a.common = common_args(xg, bg, y, c.n);
  a.num_domains = 2;
  a.sm_domain = sm_table();
  ASSERT_NE(a.sm_domain, nullptr);
  std::vector<Tensor> shards;  // each allocated in (tagged with) its domain
  for (size_t p = 0; p + 1 < c.cuts.size(); ++p) {
    const int domain = static_cast<int>(p % 2);
    shards.push_back(w.slice(0, c.cuts[p], c.cuts[p + 1]).to(Device::cuda(0), domain));
    a.parts[p] = {shards.back().data_ptr(), c.k, c.cuts[p + 1] - c.cuts[p], c.cuts[p], domain};
  }
  a.num_parts = static_cast<int32_t>(shards.size());
  ASSERT_TRUE(cuda::detail::bf16_gemv_domains_eligible(a));

  cuda::detail::launch_bf16_gemv_domains(a, caller_);
  const Tensor first = fetch(y);
  EXPECT_LT(rel_error(first.slice(1, kLeft, kLeft + c.n).clone(), ref_gemm(x, w, bias)), tol);
  expect_columns_around_poisoned(first, kLeft, c.n);

  // The one-weight kernel on the whole weight cuts the same blocks: the same bits.
  const Tensor wg = to_gpu(w);
  Tensor y_whole = poisoned_gpu({c.m, width}, c.out);
  Bf16GemvArgs whole = common_args(xg, bg, y_whole, c.n);
  whole.w = wg.data_ptr();
  whole.w_ld = c.k;
  cuda::detail::launch_bf16_gemv(whole, caller_);
  EXPECT_TRUE(bitwise_equal(fetch(y_whole), first));

  // Again, then from a graph replayed twice: the counters were left at zero each time.
  y.fill_nan_();
  cuda::detail::launch_bf16_gemv_domains(a, caller_);
  EXPECT_TRUE(bitwise_equal(fetch(y), first));
  y.fill_nan_();
  cuda::Graph g;
  g.begin_capture(caller_);
  cuda::detail::launch_bf16_gemv_domains(a, caller_);
  g.end_capture();
  for (int replay = 0; replay < 2; ++replay) {
    g.replay(caller_);
    EXPECT_TRUE(bitwise_equal(fetch(y), first)) << "replay " << replay;
  }

  // New weights copied into the shards' own buffers: the replay reads them.
  const Tensor w2 = randn({c.n, c.k}, DType::kBF16, seed + 7, 0.05);
  for (size_t p = 0; p < shards.size(); ++p) {
    Tensor s = shards[p];
    s.copy_(w2.slice(0, c.cuts[p], c.cuts[p + 1]).clone());
  }
  y.fill_nan_();
  g.replay(caller_);
  const Tensor reloaded = fetch(y);
  EXPECT_LT(rel_error(reloaded.slice(1, kLeft, kLeft + c.n).clone(), ref_gemm(x, w2, bias)), tol);
  expect_columns_around_poisoned(reloaded, kLeft, c.n);
}

// 1-4 tokens; K from one vector a row to o_proj's 16384; two shards of unequal size, and three
// or four (a domain with two shards, found by the unit's part search); shards whose row counts
// are not whole blocks; 1, 2, 4 and 8 row slots a block.
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaBf16GemvDomains,
    ::testing::Values(DomainsCase{1, 7168, 2048, {0, 3584, 7168}, DType::kBF16, 0},
                      DomainsCase{1, 1100, 16384, {0, 533, 1100}, DType::kBF16, 1},
                      DomainsCase{2, 300, 1000, {0, 150, 300}, DType::kFP32, 2},
                      DomainsCase{3, 1029, 2056, {0, 300, 700, 1029}, DType::kBF16, 0},
                      DomainsCase{4, 96, 7168, {0, 40, 96}, DType::kFP32, 1},
                      DomainsCase{2, 4229, 512, {0, 1000, 2111, 3000, 4229}, DType::kBF16, 2},
                      DomainsCase{1, 17, 8, {0, 9, 17}, DType::kBF16, 1},
                      DomainsCase{4, 24576, 1536, {0, 12288, 24576}, DType::kBF16, 0}));

// Without a table every SM counts as domain 0, and with a table that puts every SM in domain 0
// likewise: domain 1's rows are all stolen, and every output is still written once.
TEST_F(CudaCallerStream, GemvDomainWithoutSmsIsStolen) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t M = 2, N = 2000, K = 1024, n0 = 700;
  const Tensor x = randn({M, K}, DType::kBF16, seed);
  const Tensor w = randn({N, K}, DType::kBF16, seed + 1, 0.05);
  const Tensor xg = to_gpu(x), s0 = to_gpu(w.slice(0, 0, n0).clone()), s1 = to_gpu(w.slice(0, n0, N).clone());
  const Tensor zeros = Tensor::zeros({1024}, DType::kU8, Device::cuda(0));
  for (const bool with_table : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "with_table " << with_table);
    Tensor y = poisoned_gpu({M, N + kLeft + kRight}, DType::kBF16);
    Bf16GemvDomainArgs a;
    a.common = common_args(xg, Tensor(), y, N);
    a.num_domains = 2;
    a.sm_domain = with_table ? zeros.data<uint8_t>() : nullptr;
    a.parts[0] = {s0.data_ptr(), K, n0, 0, 0};
    a.parts[1] = {s1.data_ptr(), K, N - n0, n0, 1};
    a.num_parts = 2;
    for (int call = 0; call < 2; ++call) {
      y.fill_nan_();
      cuda::detail::launch_bf16_gemv_domains(a, caller_);
      const Tensor out = fetch(y);
      EXPECT_LT(rel_error(out.slice(1, kLeft, kLeft + N).clone(), ref_gemm(x, w)), bf16_gemm_tolerance(K));
      expect_columns_around_poisoned(out, kLeft, N);
    }
  }
}

TEST(CudaBf16GemvDomainsRules, TakesEligibleShardsOnly) {
  alignas(16) static uint16_t buf[256];
  Bf16GemvDomainArgs a;
  a.common.x = buf;
  a.common.m = 1;
  a.common.k = 16;
  a.common.x_ld = 16;
  a.num_domains = 2;
  a.parts[0] = {buf, 16, 4, 0, 0};
  a.parts[1] = {buf + 64, 16, 4, 4, 1};
  a.num_parts = 2;
  EXPECT_TRUE(cuda::detail::bf16_gemv_domains_eligible(a));
  Bf16GemvDomainArgs b = a;
  b.parts[1].domain = 2;  // no such domain
  EXPECT_FALSE(cuda::detail::bf16_gemv_domains_eligible(b));
  b = a;
  b.parts[1].w = buf + 1;  // rows not 16-byte aligned
  EXPECT_FALSE(cuda::detail::bf16_gemv_domains_eligible(b));
  b = a;
  b.common.m = cuda::detail::kBf16GemvMaxM + 1;
  EXPECT_FALSE(cuda::detail::bf16_gemv_domains_eligible(b));
  b = a;
  b.num_parts = 0;
  EXPECT_FALSE(cuda::detail::bf16_gemv_domains_eligible(b));
}

// ops::gemm_partitioned and gemm_swiglu_partitioned on CUDA at decode M. Captured before any
// eager call, a path choice without an answer takes its first path untimed: the domain-aware
// launch (for SwiGLU with its scratch and SwiGLU kernel). Then eagerly, as the timed choice picks
// (this launch or the fork/join), and from a graph captured after it, which replays the eager
// bits. Every result matches fp64.
TEST_F(CudaTwoDomains, PartitionedOpsAtDecodeTakeTheLaunchInAGraphAndMatchFp64) {
  for (const int64_t m : {1, 2, 4}) {
    for (const bool swiglu : {false, true}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << m << " swiglu " << swiglu);
      const int64_t N = swiglu ? 1408 : 4096, K = 2048, n0 = swiglu ? 640 : 2048;  // N: output columns
      const Tensor x = randn({m, K}, DType::kBF16, seed);
      const Tensor w = randn({swiglu ? 2 * N : N, K}, DType::kBF16, seed + 1, 0.05);  // [gate; up] with SwiGLU
      const Tensor bias = swiglu ? Tensor() : randn({N}, DType::kBF16, seed + 2);
      const Tensor xg = to_gpu(x), bg = bias.defined() ? to_gpu(bias) : Tensor();
      // Shard d holds its columns' rows: with SwiGLU its gate rows, then its up rows.
      auto shard = [&](int64_t a, int64_t b, int domain) {
        if (!swiglu) return w.slice(0, a, b).to(Device::cuda(0), domain);
        Tensor s = Tensor::empty({2 * (b - a), K}, DType::kBF16);
        s.slice(0, 0, b - a).copy_(w.slice(0, a, b));
        s.slice(0, b - a, 2 * (b - a)).copy_(w.slice(0, N + a, N + b));
        return s.to(Device::cuda(0), domain);
      };
      const std::vector<Tensor> shards = {shard(0, n0, 0), shard(n0, N, 1)};
      const std::vector<ops::PartitionSlice> slices = {{0, n0, Stream{Device::cuda(0), parts_[0].stream}},
                                                       {n0, N, Stream{Device::cuda(0), parts_[1].stream}}};
      const std::vector<double> ref = swiglu ? ref_swiglu(ref_gemm(x, w), m, N) : ref_gemm(x, w, bias);
      Tensor y = poisoned_gpu({m, N}, DType::kBF16);
      expect_captured_eager_and_graph(y, ref, bf16_gemm_tolerance(K), [&] {
        if (swiglu) ops::gemm_swiglu_partitioned(xg, shards, y, slices, caller());
        else ops::gemm_partitioned(xg, shards, bg, y, slices, caller());
      }, caller_);
    }
  }
}

}  // namespace
}  // namespace locus
