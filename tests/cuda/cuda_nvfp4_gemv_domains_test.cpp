// The NVFP4 decode matrix-vector kernel's domain-aware form (nvfp4_gemv.h): a partitioned NVFP4
// product's shards in one launch over two green-context domains, against fp64 of the dequantized
// shards on random inputs, written into their columns of a poisoned tensor (the columns around
// stay poisoned), bitwise equal to the one-weight kernel on each shard in the same block shape,
// the same bits on a second call and from graph replays (its counters reset themselves), with its
// blocks claimed by SM rank and counted alike on every call and replay, a replay after an
// in-place reload using the new weights; claimed blocks of SMs that run no CTA taken by the
// scans; every SM in one domain (the other's blocks stolen); traced launches (their timeline
// words, their bits); its eligibility and claiming rules; and the partitioned ops on each of
// their paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/domain_table.h"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/stream_gemm.h"     // kNoDomain
#include "backends/cuda/stream_scratch.h"  // sm_count_for
#include "cuda_test_util.h"
#include "ops/partitioned.h"

namespace locus {
namespace {

using namespace locus::testing;
using cuda::detail::Nvfp4GemvArgs;
using cuda::detail::Nvfp4GemvDomainArgs;
using cuda::detail::Nvfp4PartitionedPath;

struct Fp4DomainsCase {
  int64_t m, k;
  std::vector<int64_t> cuts;  // shard p: output columns [cuts[p], cuts[p + 1]) on domain p % 2
  DType out;
  int bias;  // 0 none, 1 bf16, 2 fp32
  bool swiglu;
};

// The output sits at columns [kLeft, kLeft + n) of a poisoned [m, n + kLeft + kRight] tensor.
constexpr int64_t kLeft = 3, kRight = 5;

// The partitioned product's reference: shard p's columns from its own dequantized weight.
std::vector<double> reference(const Tensor& x, const std::vector<ops::Nvfp4Weight>& host, const Tensor& bias,
                              const Fp4DomainsCase& c) {
  const int64_t n = c.cuts.back();
  std::vector<double> ref(static_cast<size_t>(c.m * n));
  for (size_t p = 0; p < host.size(); ++p) {
    const int64_t c0 = c.cuts[p], cols = c.cuts[p + 1] - c0;
    const Tensor b = bias.defined() ? bias.slice(0, c0, c0 + cols).clone() : Tensor();
    std::vector<double> r = c.swiglu ? ref_swiglu(ref_gemm_dense(x, dequant_ref(host[p]), 2 * cols), c.m, cols)
                                     : ref_gemm_dense(x, dequant_ref(host[p]), cols, b);
    for (int64_t t = 0; t < c.m; ++t)
      for (int64_t j = 0; j < cols; ++j) ref[t * n + c0 + j] = r[t * cols + j];
  }
  return ref;
}

// The two halves of a random NVFP4 [n, k] weight by rows (host), prepared on domains 0 and 1.
std::pair<std::vector<ops::Nvfp4Weight>, std::vector<ops::Nvfp4Weight>> halves_on_two_domains(int64_t n, int64_t k,
                                                                                              uint64_t seed) {
  std::vector<ops::Nvfp4Weight> host = {random_nvfp4(n / 2, k, seed), random_nvfp4(n / 2, k, seed + 1)};
  std::vector<ops::Nvfp4Weight> shards = {cuda::nvfp4_prepare(host[0], 0, 0), cuda::nvfp4_prepare(host[1], 0, 1)};
  return {std::move(host), std::move(shards)};
}

class CudaNvfp4GemvDomains : public CudaTwoDomains, public ::testing::WithParamInterface<Fp4DomainsCase> {};

TEST_P(CudaNvfp4GemvDomains, ShardsMatchFp64AndTheOneWeightKernelsBitsAndReplayAfterReload) {
  const Fp4DomainsCase c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << c.m << " k " << c.k);
  const int64_t n = c.cuts.back(), parts = static_cast<int64_t>(c.cuts.size()) - 1;
  std::vector<ops::Nvfp4Weight> host, shards;
  std::vector<ops::PartitionSlice> slices;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t cols = c.cuts[p + 1] - c.cuts[p];
    host.push_back(random_nvfp4((c.swiglu ? 2 : 1) * cols, c.k, seed + p));
    shards.push_back(cuda::nvfp4_prepare(host.back(), 0, static_cast<int>(p % 2)));
    slices.push_back({c.cuts[p], c.cuts[p + 1], Stream{Device::cuda(0), parts_[p % 2].stream}});
  }
  const Tensor x = randn({c.m, c.k}, DType::kBF16, seed + 10);
  Tensor bias;
  if (c.bias) bias = randn({n}, c.bias == 1 ? DType::kBF16 : DType::kFP32, seed + 11);
  const Tensor xg = to_gpu(x), bg = bias.defined() ? to_gpu(bias) : Tensor();
  Tensor y = poisoned_gpu({c.m, n + kLeft + kRight}, c.out);
  const Tensor ys = y.slice(1, kLeft, kLeft + n);
  std::vector<cuda::DomainSlice> domains;
  for (const ops::PartitionSlice& s : slices) domains.push_back({s.n0, s.n1, s.stream.native});

  Nvfp4GemvDomainArgs a;
  ASSERT_TRUE(cuda::detail::nvfp4_gemv_domain_args(xg, shards, bg, ys, c.swiglu, domains, &a));
  ASSERT_EQ(a.num_domains, 2);
  ASSERT_NE(a.sm_domain, nullptr);
  const double tol = c.out == DType::kBF16 ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k);
  const Tensor first = expect_slice_and_repeats(
      y, kLeft, n, reference(x, host, bias, c), tol,
      [&](cudaStream_t s) { cuda::detail::launch_nvfp4_gemv_domains(a, s); }, caller_);

  // The one-weight kernel on each shard in the launch's block shape: the same blocks, the same bits.
  const cuda::detail::Nvfp4GemvShape shape = cuda::detail::nvfp4_gemv_domains_shape(a, cuda::detail::sm_count_for(caller_));
  Tensor y_each = poisoned_gpu({c.m, n + kLeft + kRight}, c.out);
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t c0 = c.cuts[p], c1 = c.cuts[p + 1];
    const Tensor b = bg.defined() ? bg.slice(0, c0, c1) : Tensor();
    cuda::detail::launch_nvfp4_gemv(
        cuda::detail::nvfp4_gemv_args(xg, shards[p], b, y_each.slice(1, kLeft + c0, kLeft + c1), c.swiglu), shape,
        caller_);
  }
  EXPECT_TRUE(bitwise_equal(fetch(y_each), first));

  // Claimed and counted blocks alike (the forms that claim do so by default): the same bits on
  // every call and every replay of a graph, y poisoned before each (a claimed launch tags its
  // claims with a count of the stream's launches, which a replay advances).
  for (const bool claims : {true, false}) {
    cuda::detail::set_nvfp4_gemv_claims(claims);
    expect_same_bits_on_every_run(y, first, [&](cudaStream_t s) { cuda::detail::launch_nvfp4_gemv_domains(a, s); },
                                  caller_);
  }
  cuda::detail::set_nvfp4_gemv_claims(-1);  // back to the environment's

  // A graph of it, replayed after new weights were copied into the shards' own buffers.
  cuda::Graph g;
  g.begin_capture(caller_);
  cuda::detail::launch_nvfp4_gemv_domains(a, caller_);
  g.end_capture();
  std::vector<ops::Nvfp4Weight> host2;
  for (int64_t p = 0; p < parts; ++p) {
    host2.push_back(random_nvfp4(host[p].n, c.k, seed + 20 + p));
    cuda::nvfp4_prepare_into(host2.back(), shards[p]);
  }
  y.fill_nan_();
  g.replay(caller_);
  const Tensor reloaded = fetch(y);
  EXPECT_LT(rel_error(reloaded.slice(1, kLeft, kLeft + n).clone(), reference(x, host2, bias, c)), tol);
  expect_columns_around_poisoned(reloaded, kLeft, n);
}

// 1-16 tokens (9-16: two blocks of 8); K from one chunk to 7168, K % 64 != 0; two shards of
// unequal size, three (a domain with two shards, found by the unit's part search); shards not
// whole tiles or whole blocks; SwiGLU shards (each a gate and an up half); biases; bf16 and fp32
// outputs.
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaNvfp4GemvDomains,
    ::testing::Values(Fp4DomainsCase{1, 2048, {0, 3584, 7168}, DType::kBF16, 0, false},
                      Fp4DomainsCase{2, 1040, {0, 333, 1000}, DType::kFP32, 2, false},
                      Fp4DomainsCase{5, 7168, {0, 100, 260, 512}, DType::kBF16, 1, false},
                      Fp4DomainsCase{16, 1536, {0, 700, 1100}, DType::kBF16, 0, false},
                      Fp4DomainsCase{12, 80, {0, 40, 72}, DType::kFP32, 1, false},
                      Fp4DomainsCase{1, 7168, {0, 1024, 2048}, DType::kBF16, 0, true},
                      Fp4DomainsCase{9, 2000, {0, 256, 640}, DType::kFP32, 0, true}));

// Claimed blocks whose SM never runs a CTA of the launch: tables that put every fourth SM in
// domain 0 and the next in domain 1 (the others in none) but give each domain twice its SMs, so
// the blocks of the upper ranks belong to SMs that do not exist. The CTAs' scans find them and
// take them (those of SMs in no domain only scan): every output is written on every call and
// replay, with the bits of the counted launch.
TEST_F(CudaTwoDomains, ClaimedBlocksOfAbsentSmsAreTakenByScans) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t m = 1, k = 2048, n = 7168;
  const auto [host, shards] = halves_on_two_domains(n, k, seed);
  const Tensor x = randn({m, k}, DType::kBF16, seed + 2);
  const Tensor xg = to_gpu(x);
  Tensor y = poisoned_gpu({m, n}, DType::kBF16);
  Nvfp4GemvDomainArgs a;
  ASSERT_TRUE(cuda::detail::nvfp4_gemv_domain_args(
      xg, shards, Tensor(), y, false, {{0, n / 2, parts_[0].stream}, {n / 2, n, parts_[1].stream}}, &a));
  cuda::detail::set_nvfp4_gemv_shape({2, 8});  // a form that claims its blocks
  cuda::detail::set_nvfp4_gemv_claims(false);
  cuda::detail::launch_nvfp4_gemv_domains(a, caller_);
  const Tensor counted = fetch(y);
  EXPECT_LT(rel_error(counted.clone(), reference(x, host, Tensor(), {m, k, {0, n / 2, n}, DType::kBF16, 0, false})),
            bf16_gemm_tolerance(k));
  cuda::detail::set_nvfp4_gemv_claims(true);

  const int sms = cuda::detail::sm_count_for(caller_);
  Tensor tables = Tensor::zeros({2048}, DType::kU8, Device::cpu());
  uint8_t* t = tables.data<uint8_t>();
  std::fill(t, t + 1024, cuda::detail::kNoDomain);
  int32_t present[2] = {0, 0};
  for (int sm = 0; sm < sms; ++sm)
    if (sm % 4 < 2) t[sm] = static_cast<uint8_t>(sm % 4), t[1024 + sm] = static_cast<uint8_t>(present[sm % 4]++);
  const Tensor tables_gpu = to_gpu(tables);
  a.sm_domain = tables_gpu.data<uint8_t>();
  a.sm_rank = a.sm_domain + 1024;
  for (int d = 0; d < 2; ++d) a.domain_sms[d] = 2 * present[d];
  bool claimed = false;
  cuda::detail::launch_nvfp4_gemv_domains(a, caller_, &claimed);
  EXPECT_TRUE(claimed) << "the launch counted its blocks";
  expect_same_bits_on_every_run(y, counted, [&](cudaStream_t s) { cuda::detail::launch_nvfp4_gemv_domains(a, s); },
                                caller_);
  cuda::detail::set_nvfp4_gemv_claims(-1);  // back to the environment's
  cuda::detail::set_nvfp4_gemv_shape({0, 0});
}

// Without a table every SM counts as domain 0, and with a table that puts every SM in domain 0
// likewise: domain 1's blocks are all stolen, and every output is still written once.
TEST_F(CudaCallerStream, Nvfp4GemvDomainWithoutSmsIsStolen) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Fp4DomainsCase c{3, 1024, {0, 700, 2000}, DType::kBF16, 0, false};
  const std::vector<ops::Nvfp4Weight> host = {random_nvfp4(700, c.k, seed), random_nvfp4(1300, c.k, seed + 1)};
  const std::vector<ops::Nvfp4Weight> shards = {cuda::nvfp4_prepare(host[0], 0, -1), cuda::nvfp4_prepare(host[1], 0, -1)};
  const Tensor x = randn({c.m, c.k}, DType::kBF16, seed + 2);
  const Tensor xg = to_gpu(x);
  const Tensor zeros = Tensor::zeros({1024}, DType::kU8, Device::cuda(0));
  const std::vector<double> ref = reference(x, host, Tensor(), c);
  for (const bool with_table : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "with_table " << with_table);
    Tensor y = poisoned_gpu({c.m, 2000 + kLeft + kRight}, c.out);
    Nvfp4GemvDomainArgs a;
    ASSERT_TRUE(cuda::detail::nvfp4_gemv_domain_args(xg, shards, Tensor(), y.slice(1, kLeft, kLeft + 2000), false,
                                                      {{0, 700, caller_}, {700, 2000, caller_}}, &a));
    a.num_domains = 2;
    a.parts[1].domain = 1;
    a.sm_domain = with_table ? zeros.data<uint8_t>() : nullptr;
    expect_slice_and_repeats(y, kLeft, 2000, ref, bf16_gemm_tolerance(c.k),
                             [&](cudaStream_t s) { cuda::detail::launch_nvfp4_gemv_domains(a, s); }, caller_);
  }
}

// A timeline (Nvfp4GemvArgs::trace, for cuda_gemv_timeline_bench) changes no output bit, and
// every CTA of both launches stamps its words in order: start, waited, first block known, last
// block written, exit (a domain-aware CTA that takes no block stamps its exit time into the
// block words; one that claims its block knows it before it waits).
TEST_F(CudaTwoDomains, TracedNvfp4GemvLaunchesKeepTheirBitsAndStampEveryCta) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t m = 3, k = 1024, n = 2048;
  const auto [host, shards] = halves_on_two_domains(n, k, seed);
  const Tensor xg = to_gpu(randn({m, k}, DType::kBF16, seed + 2));
  Tensor y = poisoned_gpu({m, n}, DType::kBF16), y_traced = poisoned_gpu({m, n}, DType::kBF16);
  auto expect_ordered = [](const std::vector<std::vector<unsigned long long>>& recs, bool claimed) {
    namespace cd = cuda::detail;
    for (size_t i = 0; i < recs.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "record " << i);
      const auto& r = recs[i];
      EXPECT_GT(r[cd::kGemvTraceStart], 0u);
      EXPECT_LE(r[cd::kGemvTraceStart], r[cd::kGemvTraceWaited]);
      EXPECT_LE(claimed ? r[cd::kGemvTraceStart] : r[cd::kGemvTraceWaited], r[cd::kGemvTraceUnit]);
      for (int w = cd::kGemvTraceBody; w < cd::kGemvTraceWords; ++w) EXPECT_LE(r[w - 1], r[w]) << "word " << w;
      EXPECT_LE(r[cd::kGemvTraceWaited], r[cd::kGemvTraceBody]);
    }
  };
  cuda::detail::set_nvfp4_gemv_shape({2, 8});  // a form that claims its blocks
  for (const bool claims : {true, false}) {  // the domain-aware launch, its blocks claimed, then counted
    SCOPED_TRACE(::testing::Message() << "claims " << claims);
    cuda::detail::set_nvfp4_gemv_claims(claims);
    Nvfp4GemvDomainArgs a;
    ASSERT_TRUE(cuda::detail::nvfp4_gemv_domain_args(
        xg, shards, Tensor(), y, false, {{0, n / 2, parts_[0].stream}, {n / 2, n, parts_[1].stream}}, &a));
    bool claimed = !claims;
    cuda::detail::launch_nvfp4_gemv_domains(a, caller_, &claimed);
    EXPECT_EQ(claimed, claims);
    TraceRecords records(4096, cuda::detail::kGemvTraceWords);
    a.common.y = y_traced.data_ptr();
    a.common.trace = records.trace();
    cuda::detail::launch_nvfp4_gemv_domains(a, caller_);
    const auto recs = records.read();
    EXPECT_TRUE(bitwise_equal(fetch(y_traced), fetch(y)));
    ASSERT_FALSE(recs.empty()) << "no CTA was traced";
    expect_ordered(recs, claimed);
    // As many CTAs as the launch's plan: counted, at most one a block; claimed, a few an SM.
    const int64_t blocks = cuda::detail::nvfp4_gemv_blocks(
        cuda::detail::nvfp4_gemv_args(xg, shards[0], Tensor(), y, false),
        cuda::detail::nvfp4_gemv_domains_shape(a, cuda::detail::sm_count_for(caller_)));
    EXPECT_LE(recs.size(), static_cast<size_t>(claimed ? int64_t{cuda::detail::kClaimWordsPerSm} *
                                                             cuda::detail::sm_count_for(caller_)
                                                       : 2 * blocks));
  }
  cuda::detail::set_nvfp4_gemv_claims(-1);  // back to the environment's
  cuda::detail::set_nvfp4_gemv_shape({0, 0});
  {  // the one-weight launch: one record a block
    y.fill_nan_();
    y_traced.fill_nan_();
    const Tensor ys = y.slice(1, 0, n / 2), yts = y_traced.slice(1, 0, n / 2);
    Nvfp4GemvArgs a = cuda::detail::nvfp4_gemv_args(xg, shards[0], Tensor(), ys, false);
    cuda::detail::launch_nvfp4_gemv(a, caller_);
    TraceRecords records(4096, cuda::detail::kGemvTraceWords);
    a.y = yts.data_ptr();
    a.trace = records.trace();
    cuda::detail::launch_nvfp4_gemv(a, caller_);
    const auto recs = records.read();
    EXPECT_TRUE(bitwise_equal(fetch(y_traced), fetch(y)));
    expect_ordered(recs, false);
    EXPECT_EQ(recs.size(), static_cast<size_t>(cuda::detail::nvfp4_gemv_blocks(
                               a, cuda::detail::nvfp4_gemv_shape(a, cuda::detail::sm_count_for(caller_)))));
  }
}

TEST(CudaNvfp4GemvDomainsRules, TakesEligibleShardsOnly) {
  alignas(16) static uint8_t codes[1024];
  alignas(16) static uint16_t buf[256];
  const float scale = 1.f;
  Nvfp4GemvDomainArgs a;
  a.common.x = buf;
  a.common.m = 1;
  a.common.k = 64;
  a.common.x_ld = 64;
  a.num_domains = 2;
  a.parts[0] = {codes, buf, &scale, 16, 0, 0};
  a.parts[1] = {codes + 512, buf, &scale, 20, 16, 1};
  a.num_parts = 2;
  EXPECT_TRUE(cuda::detail::nvfp4_gemv_domains_eligible(a));
  Nvfp4GemvDomainArgs b = a;
  b.parts[1].domain = 2;  // no such domain
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_domains_eligible(b));
  b = a;
  b.parts[1].codes = codes + 1;  // codes not 16-byte aligned
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_domains_eligible(b));
  b = a;
  b.common.m = cuda::detail::kNvfp4GemvMaxM + 1;
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_domains_eligible(b));
  b = a;
  b.num_parts = 0;
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_domains_eligible(b));
  b = a;
  b.common.swiglu = true;  // shard 1's 20 outputs: its up rows would not start on a tile
  EXPECT_FALSE(cuda::detail::nvfp4_gemv_domains_eligible(b));
  b.parts[1].n = 32;
  EXPECT_TRUE(cuda::detail::nvfp4_gemv_domains_eligible(b));
}

// plan_gemv_claims (host): a launch of slots x SMs CTAs, taken only where every domain's units fit
// its SMs' slots and the launch's CTAs and units fit the stream's words; the counters' plan
// otherwise.
TEST(CudaNvfp4GemvDomainsRules, ClaimsTakeFittingPlansOnly) {
  namespace cd = cuda::detail;
  const int32_t domain_sms[2] = {66, 66};
  const int stride = cd::kClaimWordsPerSm * 132;
  std::vector<unsigned long long> words(3 * stride);
  unsigned counters[cd::kGemvMaxDomains] = {};
  auto plan = [&](int64_t units0, int64_t units1, cd::GemvDomainPlan* pl) {
    const int32_t part_domain[2] = {0, 1};
    const int64_t part_units[2] = {units0, units1};
    cd::plan_gemv_domains(part_domain, part_units, 2, 2, counters, 264, pl);
  };
  cd::GemvDomainPlan pl;
  plan(100, 132, &pl);
  ASSERT_TRUE(cd::plan_gemv_claims(domain_sms, 2, 2, 132, words.data(), stride, &pl));
  EXPECT_EQ(pl.total_ctas, 264);
  EXPECT_EQ(pl.counted, 0);
  EXPECT_EQ(pl.claim_base[1], 100);
  EXPECT_EQ(pl.claim_words, 232);
  EXPECT_EQ(pl.slots_per_sm, 2);
  EXPECT_EQ(pl.arrivals, words.data());
  EXPECT_EQ(pl.claims, words.data() + stride);

  plan(100, 133, &pl);  // domain 1: 133 units for 66 SMs x 2 slots
  EXPECT_FALSE(cd::plan_gemv_claims(domain_sms, 2, 2, 132, words.data(), stride, &pl));
  EXPECT_EQ(pl.counted, 1);
  plan(100, 132, &pl);
  EXPECT_FALSE(cd::plan_gemv_claims(domain_sms, 2, 2, 132, words.data(), 263, &pl));  // 264 CTAs
  EXPECT_FALSE(cd::plan_gemv_claims(domain_sms, 2, 2, 132, nullptr, stride, &pl));
  EXPECT_FALSE(cd::plan_gemv_claims(nullptr, 2, 2, 132, words.data(), stride, &pl));
  const int32_t no_sms[2] = {66, 0};  // domain 1 has units but no SM
  EXPECT_FALSE(cd::plan_gemv_claims(no_sms, 2, 2, 132, words.data(), stride, &pl));
  EXPECT_EQ(pl.counted, 1);
}

// ops::nvfp4_gemm_partitioned and nvfp4_gemm_swiglu_partitioned on two emulated domains at decode
// M on each path (forced: the streaming kernel's launch, the fork/join of per-partition
// matrix-vector launches, this kernel's launch; then as timed): captured before any eager call,
// eagerly, then a graph of the choice, bitwise. Every result against fp64.
TEST_F(CudaTwoDomains, PartitionedNvfp4OpsMatchFp64OnEachPath) {
  const ScopedNvfp4Path per_partition(Nvfp4Path::kMatrixVector);
  for (const Nvfp4PartitionedPath path : {Nvfp4PartitionedPath::kStreamingLaunch, Nvfp4PartitionedPath::kForkJoin,
                                          Nvfp4PartitionedPath::kMatrixVectorLaunch, Nvfp4PartitionedPath::kTimed}) {
    cuda::detail::set_nvfp4_partitioned_path(path);
    for (const int64_t m : {1, 16}) {
      for (const bool swiglu : {false, true}) {
        const uint64_t seed = fresh_seed();
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " M " << m << (swiglu ? " SwiGLU" : "") << " path "
                                          << static_cast<int>(path));
        const Fp4DomainsCase c{m, 1536, swiglu ? std::vector<int64_t>{0, 256, 640} : std::vector<int64_t>{0, 512, 1000},
                               DType::kBF16, swiglu ? 0 : 2, swiglu};
        std::vector<ops::Nvfp4Weight> host, shards;
        std::vector<ops::PartitionSlice> slices;
        for (int p = 0; p < 2; ++p) {
          const int64_t cols = c.cuts[p + 1] - c.cuts[p];
          host.push_back(random_nvfp4((swiglu ? 2 : 1) * cols, c.k, seed + p));
          shards.push_back(cuda::nvfp4_prepare(host.back(), 0, p));
          slices.push_back({c.cuts[p], c.cuts[p + 1], Stream{Device::cuda(0), parts_[p].stream}});
        }
        const Tensor x = randn({m, c.k}, DType::kBF16, seed + 2);
        const Tensor bias = swiglu ? Tensor() : randn({c.cuts.back()}, DType::kFP32, seed + 3);
        const Tensor xg = to_gpu(x), bg = bias.defined() ? to_gpu(bias) : Tensor();
        Tensor y = poisoned_gpu({m, c.cuts.back()}, DType::kBF16);
        expect_captured_eager_and_graph(y, reference(x, host, bias, c), bf16_gemm_tolerance(c.k), [&] {
          if (swiglu) ops::nvfp4_gemm_swiglu_partitioned(xg, shards, y, slices, caller());
          else ops::nvfp4_gemm_partitioned(xg, shards, bg, y, slices, caller());
        }, caller_);
      }
    }
  }
  cuda::detail::set_nvfp4_partitioned_path(Nvfp4PartitionedPath::kTimed);
}

}  // namespace
}  // namespace locus
