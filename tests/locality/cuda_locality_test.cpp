// The locality layer on a real GPU (skipped without one; compiled only in CUDA builds):
// emulated topology vs the SM partitions actually created, the limit error, and partitioned
// ops on green-context domain streams checked against fp64 references, eagerly and replayed
// from a CUDA graph captured across the fork/join.
#if defined(LOCUS_WITH_CUDA)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <optional>
#include <set>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "core/error.h"
#include "locality/domain_place.h"
#include "locality/planner.h"
#include "locality/shards.h"
#include "ops/partitioned.h"
#include "test_util.h"

namespace locus::locality {
namespace {

using namespace locus::testing;

class ScopedFakeDomains {
 public:
  explicit ScopedFakeDomains(const char* value) {
    if (const char* old = std::getenv(kName)) old_ = old;
    if (value) {
      setenv(kName, value, 1);
    } else {
      unsetenv(kName);
    }
  }
  ~ScopedFakeDomains() {
    if (old_) {
      setenv(kName, old_->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }

 private:
  static constexpr const char* kName = "LOCUS_FAKE_LOCALITY_DOMAINS";
  std::optional<std::string> old_;
};

// fill_nan_ runs outside our (non-blocking) streams: wait for it before queuing work.
void poison(Tensor& t) {
  t.fill_nan_();
  cuda::device_synchronize(0);
}

Tensor fetch(const Tensor& t) {
  cuda::device_synchronize(0);
  return t.to(Device::cpu());
}

class CudaLocality : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaStreamCreateWithFlags(&caller_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (caller_) cudaStreamDestroy(caller_);
  }
  Stream caller() const { return Stream{Device::cuda(0), caller_}; }
  cudaStream_t caller_ = nullptr;
};

TEST_F(CudaLocality, EmulatedTopologyMatchesThePartitionsCreated) {
  const cuda::DeviceInfo info = cuda::query_device(0);
  for (const char* n : {"2", "3"}) {
    ScopedFakeDomains fake(n);
    const Topology t = resolve_topology(Device::cuda(0));
    EXPECT_EQ(t.num_domains, std::atoi(n));
    EXPECT_TRUE(t.emulated);
    EXPECT_EQ(std::accumulate(t.units_per_domain.begin(), t.units_per_domain.end(), 0) + t.supplemental_units,
              info.sm_count);
    LocalityRuntime rt(t);
    EXPECT_EQ(rt.topology().units_per_domain, t.units_per_domain) << t.describe() << " vs " << rt.topology().describe();
    std::set<void*> streams;
    for (int d = 0; d < rt.num_domains(); ++d) {
      EXPECT_TRUE(rt.place(d).device().is_cuda());
      EXPECT_EQ(rt.place(d).units(), t.units_per_domain[d]);
      ASSERT_NE(rt.place(d).stream().native, nullptr);
      streams.insert(rt.place(d).stream().native);
      Tensor m = rt.place(d).allocate({4, 64}, DType::kBF16);
      EXPECT_EQ(m.domain(), d);
    }
    EXPECT_EQ(streams.size(), static_cast<size_t>(rt.num_domains()));
  }
}

TEST_F(CudaLocality, TooManyDomainsNamesTheLimit) {
  const cuda::DeviceInfo info = cuda::query_device(0);
  const int limit = info.sm_count / std::max(1, info.min_sm_partition);
  const std::string bad = std::to_string(limit + 1);
  ScopedFakeDomains fake(bad.c_str());
  try {
    resolve_topology(Device::cuda(0));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("LOCUS_FAKE_LOCALITY_DOMAINS=" + bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("at most " + std::to_string(limit)), std::string::npos) << msg;
  }
}

TEST_F(CudaLocality, PartitionedOpsOnDomainStreamsAndInAGraph) {
  ScopedFakeDomains fake(nullptr);
  LocalityDomainPolicy pol;
  pol.enabled = true;
  for (int domains : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << domains << " domains");
    LocalityRuntime rt(resolve_topology(Device::cuda(0), domains));
    Planner planner(pol, rt.topology());
    const int64_t m = 4, k = 256, n = 640;
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Tensor x = randn({m, k}, DType::kBF16, seed);
    Tensor xg = x.to(Device::cuda(0));

    // BF16 GEMM.
    Tensor w = randn({n, k}, DType::kBF16, seed + 1, 0.05);
    Plan plan = planner.plan_linear("test.proj", k, n, QuantKind::kBF16, WeightMode::kVanilla);
    ASSERT_TRUE(plan.enabled) << plan.reason;
    std::vector<Tensor> shards;
    for (int p = 0; p < plan.num_partitions; ++p) {
      shards.push_back(make_dense_shard(w, plan.layout, p, rt.place_for_partition(p)));
      EXPECT_EQ(shards.back().domain(), p);
      EXPECT_TRUE(shards.back().device().is_cuda());
    }
    const auto slices = partition_slices(plan.layout, rt);
    const std::vector<double> ref = ref_gemm(x, w);
    Tensor y = Tensor::empty({m, n}, DType::kBF16, Device::cuda(0));
    poison(y);
    ops::gemm_partitioned(xg, shards, Tensor(), y, slices, caller());
    EXPECT_LT(rel_error(fetch(y), ref), bf16_gemm_tolerance(k));

    // The same call captured across the fork/join and replayed into a poisoned output.
    cuda::Graph graph;
    graph.begin_capture(caller_);
    ops::gemm_partitioned(xg, shards, Tensor(), y, slices, caller());
    graph.end_capture();
    poison(y);
    cuda::device_synchronize(0);
    graph.replay(caller_);
    EXPECT_LT(rel_error(fetch(y), ref), bf16_gemm_tolerance(k));

    // NVFP4 GEMM (shards prepared for the device kernel in their domain).
    ops::Nvfp4Weight wq = ops::nvfp4_quantize(w);
    Plan qplan = planner.plan_linear("test.proj", k, n, QuantKind::kNVFP4, WeightMode::kVanilla);
    ASSERT_TRUE(qplan.enabled) << qplan.reason;
    std::vector<ops::Nvfp4Weight> qshards;
    for (int p = 0; p < qplan.num_partitions; ++p) {
      qshards.push_back(make_nvfp4_shard(wq, qplan.layout, p, rt.place_for_partition(p)));
    }
    const std::vector<double> qref = ref_gemm(x, ops::nvfp4_dequantize(wq));
    Tensor yq = Tensor::empty({m, n}, DType::kBF16, Device::cuda(0));
    poison(yq);
    ops::nvfp4_gemm_partitioned(xg, qshards, Tensor(), yq, partition_slices(qplan.layout, rt), caller());
    EXPECT_LT(rel_error(fetch(yq), qref), bf16_gemm_tolerance(k));

    // BMM over heads (a is a transposed [T, H, K] view, as in MLA).
    const int64_t heads = 8, t = 3, bk = 128, bn = 64;
    Tensor act = randn({t, heads, bk}, DType::kBF16, seed + 2);
    Tensor b = randn({heads, bk, bn}, DType::kBF16, seed + 3, 0.1);
    Plan bplan = planner.plan_bmm("test.bmm", heads, bk, bn);
    ASSERT_TRUE(bplan.enabled) << bplan.reason;
    std::vector<Tensor> bshards;
    for (int p = 0; p < bplan.num_partitions; ++p) {
      bshards.push_back(make_bmm_shard(b, bplan.layout, p, rt.place_for_partition(p)));
    }
    Tensor ag = act.to(Device::cuda(0)).transpose(0, 1);
    Tensor yb = Tensor::empty({heads, t, bn}, DType::kFP32, Device::cuda(0));
    poison(yb);
    ops::bmm_partitioned(ag, bshards, yb, partition_slices(bplan.layout, rt), caller());
    std::vector<double> av = to_doubles(act), bv = to_doubles(b), bref(heads * t * bn, 0.0);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < bn; ++j) {
          double s = 0;
          for (int64_t c = 0; c < bk; ++c) s += av[(i * heads + h) * bk + c] * bv[(h * bk + c) * bn + j];
          bref[(h * t + i) * bn + j] = s;
        }
    EXPECT_LT(rel_error(fetch(yb), bref), fp32_out_gemm_tolerance(bk));
  }
}

}  // namespace
}  // namespace locus::locality
#endif  // LOCUS_WITH_CUDA
