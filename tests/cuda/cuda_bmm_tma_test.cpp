// The TMA-fed decode BMM (backends/cuda/bmm_tma.h) against fp64 with poisoned outputs: both weight
// layouts, every token-group size, K and N off the box grid, heads cut into several units, MLA's
// strided views; its single-launch partitioned form (bitwise equal to the unpartitioned one, with
// work stolen from a domain without SMs), every ring size and early-copy mode, graph replay after an
// in-place reload, and the problems it must refuse.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/bmm_tma.h"
#include "ops/partitioned.h"
#include "cuda_test_util.h"

namespace locus {
namespace {

using namespace locus::testing;

// The op's b operand for per-head weights w [H, N, K] on the GPU: stored [K, N] (row-major b, as
// MLA's k_b) or [N, K] (a transposed view, as MLA's v_b).
Tensor b_operand(const Tensor& w, bool n_contiguous, int domain = -1) {
  return n_contiguous ? w.transpose(1, 2).clone().to(Device::cuda(0), domain)
                      : w.to(Device::cuda(0), domain).transpose(1, 2);
}

// Activations and outputs as MLA has them: [T, H, D] buffers (with room around; activation rows of
// whole 16 bytes) viewed as [H, T, D].
struct MlaBuffers {
  Tensor act, a_host, a, out, y;
  MlaBuffers(int64_t H, int64_t T, int64_t K, int64_t N, DType out_dtype, uint64_t seed) {
    act = randn({T, H, (K + 7) / 8 * 8 + 64}, DType::kBF16, seed);
    a_host = act.slice(2, 0, K).transpose(0, 1);
    a = to_gpu(act).slice(2, 0, K).transpose(0, 1);
    out = poisoned_gpu({T, H, N + 8}, out_dtype);
    y = out.slice(2, 0, N).transpose(0, 1);
  }
  // y back as [H, T, N], after checking that the columns beyond N stayed poisoned.
  Tensor result() const {
    Tensor host = fetch(out);
    for (int64_t t = 0; t < host.size(0); ++t)
      for (int64_t h = 0; h < host.size(1); ++h)
        EXPECT_TRUE(std::isnan(get(host, (t * host.size(1) + h) * host.size(2) + host.size(2) - 1)))
            << "a column beyond N was written";
    return host.slice(2, 0, y.size(2)).transpose(0, 1).clone();
  }
};

struct Shape3 {
  int64_t heads, n, k;
};

TEST(CudaBmmTma, EveryTokenGroupAndLayoutMatchesFp64) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  // N and K off the 64 grid; K = 320 and 512 take two boxes per slot in the [K, N] layout; two
  // heads of 200 rows are cut into several units each.
  for (const Shape3 s : {Shape3{6, 200, 136}, Shape3{2, 200, 64}, Shape3{3, 72, 320}, Shape3{4, 40, 512}}) {
    for (const int64_t M : {1, 5, 8, 9, 16, 17, 32, 33, 64}) {
      for (const bool n_contiguous : {false, true}) {
        const DType out = M % 2 ? DType::kFP32 : DType::kBF16;
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " H " << s.heads << " N " << s.n << " K " << s.k << " M "
                                          << M << (n_contiguous ? " [K, N]" : " [N, K]"));
        MlaBuffers io(s.heads, M, s.k, s.n, out, seed + M);
        Tensor w = randn({s.heads, s.n, s.k}, DType::kBF16, seed + M + 1, 0.05);
        ASSERT_TRUE(cuda::bmm_tma(io.a, b_operand(w, n_contiguous), io.y, nullptr));
        const double tol = out == DType::kBF16 ? bf16_gemm_tolerance(s.k) : fp32_out_gemm_tolerance(s.k);
        EXPECT_LT(rel_error(io.result(), ref_bmm_nk(io.a_host, w)), tol);
      }
    }
  }
}

// K = 320 and 192 (rings of 2 and 4 slots: the 3 and 5 that 128 KB in flight would ask for, rounded
// down to whole slots per consumer group), with several units per CTA so that every slot is
// refilled many times.
TEST(CudaBmmTma, RingsAreRefilledManyTimes) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  for (const int64_t K : {320, 192}) {
    for (const int64_t M : {1, 16, 40}) {
      MlaBuffers io(128, M, K, 512, DType::kBF16, seed + M);
      Tensor w = randn({128, 512, K}, DType::kBF16, seed + M + 1, 0.05);
      const std::vector<double> ref = ref_bmm_nk(io.a_host, w);
      for (const bool n_contiguous : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " K " << K << " M " << M
                                          << (n_contiguous ? " [K, N]" : " [N, K]"));
        io.out.fill_nan_();
        ASSERT_TRUE(cuda::bmm_tma(io.a, b_operand(w, n_contiguous), io.y, nullptr));
        EXPECT_LT(rel_error(io.result(), ref), bf16_gemm_tolerance(K));
      }
    }
  }
}

TEST(CudaBmmTma, MlaShapes) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  // q_nope x k_b ([K, N] weights) and o_lat x v_b^T ([N, K] weights), DeepSeek-V3 sizes.
  for (const auto [s, n_contiguous] : {std::pair<Shape3, bool>{{128, 512, 128}, true}, {{128, 128, 512}, false}}) {
    for (const int64_t M : {3, 64}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " N " << s.n << " K " << s.k << " M " << M);
      MlaBuffers io(s.heads, M, s.k, s.n, DType::kBF16, seed + M);
      Tensor w = randn({s.heads, s.n, s.k}, DType::kBF16, seed + M + 1, 0.05);
      ASSERT_TRUE(cuda::bmm_tma(io.a, b_operand(w, n_contiguous), io.y, nullptr));
      EXPECT_LT(rel_error(io.result(), ref_bmm_nk(io.a_host, w)), bf16_gemm_tolerance(s.k));
    }
  }
}

// The traced kernel form (BmmTmaTuning::trace, for timelines: the stamps are compiled out of the
// form that normally runs) writes the same outputs, bitwise, and one record per CTA whose stamps
// are in order: start <= waited <= go (one domain), and each consumer group's first slot between
// the start and its end.
TEST(CudaBmmTma, TracedFormMatchesAndStampsInOrder) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  namespace cd = cuda::detail;
  const Shape3 s{6, 200, 136};
  const int64_t M = 5;
  MlaBuffers plain(s.heads, M, s.k, s.n, DType::kFP32, seed), traced(s.heads, M, s.k, s.n, DType::kFP32, seed);
  Tensor w = randn({s.heads, s.n, s.k}, DType::kBF16, seed + 1, 0.05);
  const Tensor b = b_operand(w, false);
  ASSERT_TRUE(cuda::bmm_tma(plain.a, b, plain.y, nullptr));
  TraceRecords records(4096, cd::kBmmTraceWords);
  cd::BmmTmaTuning t;
  t.trace = records.trace();
  cd::set_bmm_tma_tuning(t);
  const bool ran = cuda::bmm_tma(traced.a, b, traced.y, nullptr);
  const auto recs = records.read();
  cd::set_bmm_tma_tuning({});
  ASSERT_TRUE(ran);
  const Tensor out = traced.result();
  EXPECT_LT(rel_error(out, ref_bmm_nk(traced.a_host, w)), fp32_out_gemm_tolerance(s.k));
  EXPECT_TRUE(bitwise_equal(out, plain.result()));
  ASSERT_FALSE(recs.empty()) << "no CTA was traced";
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    SCOPED_TRACE(::testing::Message() << "record " << i);
    EXPECT_GT(r[cd::kTraceStart], 0u);
    EXPECT_LE(r[cd::kTraceStart], r[cd::kTraceWaited]);
    EXPECT_LE(r[cd::kTraceWaited], r[cd::kTraceGo]);
    for (auto [first, end] : {std::pair{cd::kTraceFirst0, cd::kTraceEnd0}, {cd::kTraceFirst1, cd::kTraceEnd1}}) {
      EXPECT_LE(r[cd::kTraceStart], r[first]);
      EXPECT_LE(r[first], r[end]);
    }
  }
}

TEST(CudaBmmTma, RefusesWhatItCannotRun) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  auto eligible = [&](int64_t M, int64_t K, int64_t K_stored) {
    MlaBuffers io(4, M, K, 64, DType::kBF16, seed);
    Tensor w = randn({4, 64, K_stored}, DType::kBF16, seed + 1, 0.05);
    return cuda::bmm_tma(io.a, to_gpu(w).slice(2, 0, K).transpose(1, 2), io.y, nullptr);
  };
  EXPECT_TRUE(eligible(64, 512, 512));
  EXPECT_FALSE(eligible(65, 128, 128)) << "M > 64";
  EXPECT_FALSE(eligible(8, 520, 520)) << "K > 512";
  EXPECT_FALSE(eligible(8, 100, 100)) << "rows of 200 bytes (TMA strides are whole 16 bytes)";
  EXPECT_TRUE(eligible(8, 100, 104)) << "K = 100 in rows of 104";
}

using CudaBmmTmaDomains = CudaTwoDomains;

TEST_F(CudaBmmTmaDomains, ShardsInOneLaunchEqualTheWholeBitwiseThroughGraphAndReload) {
  for (const auto [s, n_contiguous] : {std::pair<Shape3, bool>{{20, 512, 128}, true}, {{20, 128, 512}, false}}) {
    for (const int64_t M : {3, 40}) {
      const uint64_t seed = fresh_seed();
      const int64_t h0 = 7;  // domain 0: heads [0, 7), domain 1: [7, 20)
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " N " << s.n << " K " << s.k << " M " << M);
      MlaBuffers io(s.heads, M, s.k, s.n, DType::kBF16, seed);
      Tensor w = randn({s.heads, s.n, s.k}, DType::kBF16, seed + 1, 0.05);
      MlaBuffers whole(s.heads, M, s.k, s.n, DType::kBF16, seed);
      ASSERT_TRUE(cuda::bmm_tma(whole.a, b_operand(w, n_contiguous), whole.y, caller_));
      const Tensor expected = whole.result();
      EXPECT_LT(rel_error(expected, ref_bmm_nk(io.a_host, w)), bf16_gemm_tolerance(s.k));

      Tensor b0 = b_operand(w.slice(0, 0, h0), n_contiguous, 0), b1 = b_operand(w.slice(0, h0, s.heads), n_contiguous, 1);
      const std::vector<cuda::DomainSlice> slices = {{0, h0, parts_[0].stream}, {h0, s.heads, parts_[1].stream}};
      auto run = [&] { ASSERT_TRUE(cuda::bmm_tma_domains(io.a, {b0, b1}, io.y, slices, caller_)); };
      run();  // eager: scratch and the SM table are created outside the capture
      ASSERT_EQ(cudaStreamSynchronize(caller_), cudaSuccess);
      EXPECT_TRUE(bitwise_equal(io.result(), expected)) << "partitioned differs from unpartitioned";
      cuda::Graph graph;
      graph.begin_capture(caller_);
      run();
      graph.end_capture();
      for (int rep = 0; rep < 3; ++rep) {  // the unit counters reset themselves between replays
        io.out.fill_nan_();
        graph.replay(caller_);
        EXPECT_TRUE(bitwise_equal(io.result(), expected)) << "replay " << rep;
      }
      // In-place reload of both shards: the graph reads the new weights.
      Tensor w2 = randn({s.heads, s.n, s.k}, DType::kBF16, seed + 2, 0.05);
      auto reload = [&](Tensor& shard, int64_t from, int64_t to) {
        Tensor fresh = b_operand(w2.slice(0, from, to), n_contiguous);
        Tensor dst = n_contiguous ? shard : shard.transpose(1, 2), src = n_contiguous ? fresh : fresh.transpose(1, 2);
        dst.copy_(src);  // the contiguous storage of each
      };
      reload(b0, 0, h0);
      reload(b1, h0, s.heads);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      io.out.fill_nan_();
      graph.replay(caller_);
      EXPECT_LT(rel_error(io.result(), ref_bmm_nk(io.a_host, w2)), bf16_gemm_tolerance(s.k));
    }
  }
}

// ops::bmm_partitioned times the one-launch kernel against the fork/join once, then keeps its
// choice: both calls (and a graph of the op) match fp64.
TEST_F(CudaBmmTmaDomains, PartitionedOpChoosesAPathOnceAndKeepsIt) {
  const uint64_t seed = fresh_seed();
  const int64_t H = 16, M = 4, N = 512, K = 128, h0 = 8;
  MlaBuffers io(H, M, K, N, DType::kBF16, seed);
  Tensor w = randn({H, N, K}, DType::kBF16, seed + 1, 0.05);
  const std::vector<Tensor> shards = {b_operand(w.slice(0, 0, h0), true, 0), b_operand(w.slice(0, h0, H), true, 1)};
  const Stream caller{Device::cuda(0), caller_};
  const std::vector<ops::PartitionSlice> slices = {{0, h0, Stream{Device::cuda(0), parts_[0].stream}},
                                                   {h0, H, Stream{Device::cuda(0), parts_[1].stream}}};
  const std::vector<double> ref = ref_bmm_nk(io.a_host, w);
  cuda::Graph graph;
  for (int run = 0; run < 3; ++run) {
    io.out.fill_nan_();
    if (run == 2) {
      graph.begin_capture(caller_);
      ops::bmm_partitioned(io.a, shards, io.y, slices, caller);
      graph.end_capture();
      graph.replay(caller_);
    } else {
      ops::bmm_partitioned(io.a, shards, io.y, slices, caller);
    }
    EXPECT_LT(rel_error(io.result(), ref), bf16_gemm_tolerance(K)) << "run " << run;
  }
}

// The raw launches of the tests below: H heads of [N, K] weights (fp32 out), heads [0, h0) on
// domain 0 and [h0, H) on domain 1, with their fp64 reference.
struct TwoDomainProblem {
  int64_t k;
  MlaBuffers io;
  Tensor w, wg;
  std::vector<double> ref;
  cuda::detail::BmmTmaArgs args;

  TwoDomainProblem(int64_t H, int64_t M, int64_t N, int64_t K, int64_t h0)
      : k(K), io(H, M, K, N, DType::kFP32, fresh_seed()) {
    w = randn({H, N, K}, DType::kBF16, fresh_seed(), 0.05);
    wg = to_gpu(w);
    ref = ref_bmm_nk(io.a_host, w);
    cuda::detail::BmmTmaArgs& a = args;
    a.x = io.a.data<uint16_t>();
    a.x_head_stride = io.a.stride(0);
    a.x_row_stride = io.a.stride(1);
    a.y = io.y.data_ptr();
    a.y_head_stride = io.y.stride(0);
    a.y_row_stride = io.y.stride(1);
    a.y_f32 = true;
    a.m = static_cast<int32_t>(M);
    a.n = static_cast<int32_t>(N);
    a.k = static_cast<int32_t>(K);
    a.num_parts = 2;
    a.num_domains = 2;
    for (int p = 0; p < 2; ++p) {
      a.parts[p].w = static_cast<const uint16_t*>(wg.data_ptr()) + (p ? h0 * N * K : 0);
      a.parts[p].w_head_stride = N * K;
      a.parts[p].w_row_stride = K;
      a.parts[p].heads = static_cast<int32_t>(p ? H - h0 : h0);
      a.parts[p].head0 = static_cast<int32_t>(p ? h0 : 0);
      a.parts[p].domain = p;
    }
  }
  // The same heads as one part on one domain: an unpartitioned launch.
  cuda::detail::BmmTmaArgs whole() const {
    cuda::detail::BmmTmaArgs a = args;
    a.num_parts = a.num_domains = 1;
    a.parts[0].heads = args.parts[0].heads + args.parts[1].heads;
    a.parts[0].domain = 0;
    return a;
  }
  // Poisons y, runs `launch` on `stream` and checks y against fp64.
  void check(const std::function<void()>& launch, cudaStream_t stream, const std::string& what) {
    io.out.fill_nan_();
    launch();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_LT(rel_error(io.result(), ref), fp32_out_gemm_tolerance(k)) << what;
  }
};

// A graph of `n` launches of `a` back to back on `stream`, as in a model step.
cuda::Graph launches_graph(const cuda::detail::BmmTmaArgs& a, int n, cudaStream_t stream) {
  cuda::Graph graph;
  graph.begin_capture(stream);
  for (int i = 0; i < n; ++i) cuda::detail::launch_bmm_tma(a, stream);
  graph.end_capture();
  return graph;
}

// Rank tables for `args` (kept alive by the returned device tensor): SM s is rank rank_of(s) of
// domain domain_of(s); domain 0 has (sms + 1) / 2 ranks, domain 1 sms / 2.
Tensor set_rank_tables(cuda::detail::BmmTmaArgs& args, int sms, const std::function<int(int)>& domain_of,
                       const std::function<int(int)>& rank_of) {
  Tensor host_tables = Tensor::zeros({2048}, DType::kU8);
  auto* t = static_cast<uint8_t*>(host_tables.data_ptr());
  for (int sm = 0; sm < 1024; ++sm) {
    t[sm] = static_cast<uint8_t>(domain_of(sm));
    t[1024 + sm] = static_cast<uint8_t>(rank_of(sm));
  }
  Tensor tables = to_gpu(host_tables);
  args.sm_domain = tables.data<uint8_t>();
  args.sm_rank = tables.data<uint8_t>() + 1024;
  args.domain_sms[0] = (sms + 1) / 2;
  args.domain_sms[1] = sms / 2;
  return tables;
}

// Every SM its own rank: even SMs in domain 0, odd ones in domain 1.
int sm_parity(int sm) { return sm % 2; }
int half_sm(int sm) { return sm / 2; }
// Colliding guesses: every SM claims to be one of domain 0's first four ranks.
int domain_0(int) { return 0; }
int one_of_four(int sm) { return sm % 4; }

// Correctness never depends on where CTAs land. Without rank tables (atomic counters): with every
// SM mapped to domain 0, domain 1's heads are all stolen; with no table, likewise.
TEST_F(CudaBmmTmaDomains, DomainWithoutSmsIsStolen) {
  TwoDomainProblem pb(12, 6, 256, 128, 5);
  Tensor table = Tensor::zeros({1024}, DType::kU8, Device::cuda(0));
  for (const bool with_table : {true, false}) {
    pb.args.sm_domain = with_table ? table.data<uint8_t>() : nullptr;
    ASSERT_TRUE(cuda::detail::bmm_tma_eligible(pb.args));
    pb.check([&] { cuda::detail::launch_bmm_tma(pb.args, caller_); }, caller_,
             with_table ? "all SMs on domain 0" : "no table");
  }
}

// With rank tables in which every SM claims to be one of domain 0's first four ranks, almost every
// CTA's first guess is taken: they claim the free ranks instead (both domains'), their speculative
// copies are not written, and every unit is still done once; in eager launches and graph replays
// alike (the claims count launches).
TEST_F(CudaBmmTmaDomains, RanksAreClaimedWhereverCtasLand) {
  TwoDomainProblem pb(24, 9, 512, 128, 10);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const Tensor tables = set_rank_tables(pb.args, sms, domain_0, one_of_four);
  const cuda::Graph graph = launches_graph(pb.args, 1, caller_);
  // Two eager launches, then three replays.
  for (int rep = 0; rep < 5; ++rep) {
    pb.check([&] { rep < 2 ? cuda::detail::launch_bmm_tma(pb.args, caller_) : graph.replay(caller_); }, caller_,
             "run " + std::to_string(rep));
  }
}

// Domains that leave some SMs out (the tiny model's emulated 64 + 64 of 132): the CTAs that land
// on those SMs, and those they displace, claim the ranks whose SMs got no CTA; every unit is still
// done once, eagerly and in graph replays.
TEST_F(CudaBmmTmaDomains, SmsOutsideEveryDomainStillGetEveryUnitDone) {
  TwoDomainProblem pb(24, 9, 512, 128, 10);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  ASSERT_GT(sms, 8);
  const int inside = (sms - 4) / 2 * 2;  // the last SMs belong to no domain
  const Tensor tables = set_rank_tables(
      pb.args, sms, [&](int sm) { return sm < inside ? sm % 2 : 0xFF; }, half_sm);
  pb.args.domain_sms[0] = pb.args.domain_sms[1] = inside / 2;
  const cuda::Graph graph = launches_graph(pb.args, 1, caller_);
  for (int rep = 0; rep < 4; ++rep) {
    pb.check([&] { rep < 2 ? cuda::detail::launch_bmm_tma(pb.args, caller_) : graph.replay(caller_); }, caller_,
             "run " + std::to_string(rep));
  }
}

// Units longer than the ring (K = 512: two slots of 64 rows; more heads than SMs: whole heads of
// 512 rows as units). A CTA copies its guessed rank's first slots before the claim and the rest of
// that unit after it; with true ranks (every guess held) and with colliding ones (most guesses
// taken: the unit is finished but not written).
TEST_F(CudaBmmTmaDomains, UnitsLongerThanTheRing) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const int64_t M : {1, 24}) {
    TwoDomainProblem pb(sms + 4, M, 512, 512, sms / 2);
    for (const bool true_ranks : {true, false}) {
      const Tensor tables = true_ranks ? set_rank_tables(pb.args, sms, sm_parity, half_sm)
                                       : set_rank_tables(pb.args, sms, domain_0, one_of_four);
      const cuda::Graph graph = launches_graph(pb.args, 1, caller_);
      for (int rep = 0; rep < 3; ++rep)
        pb.check([&] { rep == 0 ? cuda::detail::launch_bmm_tma(pb.args, caller_) : graph.replay(caller_); }, caller_,
                 std::string(true_ranks ? "true ranks" : "colliding ranks") + " M " + std::to_string(M) + " run " +
                     std::to_string(rep));
    }
  }
}

// The ring is a whole number of slots per consumer group (so that each slot is always the same
// group's: with a ring of 3 the kernel read slots before their copies landed and hung or faulted,
// 2026-12-04), for the built-in choice at every K and token group and for every size the benchmark
// knob asks for. Each of those sizes on MLA's q_nope x k_b shape: unpartitioned, as one partitioned
// launch with true ranks, in the [K, N] layout, and in graphs of back-to-back launches.
TEST_F(CudaBmmTmaDomains, EveryRingSize) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  TwoDomainProblem pb(128, 1, 512, 128, 64);
  const Tensor kn = b_operand(pb.w, true);  // k_b's layout
  const cuda::detail::BmmTmaArgs whole = pb.whole();
  const Tensor tables = set_rank_tables(pb.args, sms, sm_parity, half_sm);
  for (int k = 64; k <= 512; k += 64)
    for (const int m : {1, 9, 17, 33, 64})
      for (const bool f32 : {false, true}) {
        cuda::detail::BmmTmaArgs a = whole;
        a.k = k;
        a.m = m;
        a.y_f32 = f32;
        const int ring = cuda::detail::bmm_tma_ring_slots(a);
        EXPECT_TRUE(ring >= 2 && ring % 2 == 0) << "K " << k << " M " << m << (f32 ? " fp32" : " bf16") << ": " << ring;
      }
  for (const int slots : {2, 3, 4, 5, 6, 7, 8}) {
    cuda::detail::BmmTmaTuning tuning;
    tuning.slots = slots;
    const std::string what = "slots " + std::to_string(slots);
    // Beside the next launch (the default over two domains) half an SM may hold fewer slots.
    cuda::detail::set_bmm_tma_tuning(tuning);
    const int beside = cuda::detail::bmm_tma_ring_slots(pb.args);
    EXPECT_TRUE(beside >= 2 && beside % 2 == 0 && beside <= slots - slots % 2) << what << ": " << beside;
    pb.check([&] { cuda::detail::launch_bmm_tma(pb.args, caller_); }, caller_, "parts beside the next launch, " + what);
    // With the whole SM's room every asked-for size fits.
    tuning.beside_next = 0;
    cuda::detail::set_bmm_tma_tuning(tuning);
    EXPECT_EQ(cuda::detail::bmm_tma_ring_slots(whole), slots - slots % 2) << what;
    EXPECT_EQ(cuda::detail::bmm_tma_ring_slots(pb.args), slots - slots % 2) << what;
    pb.check([&] { cuda::detail::launch_bmm_tma(whole, caller_); }, caller_, "whole, " + what);
    pb.check([&] { cuda::detail::launch_bmm_tma(pb.args, caller_); }, caller_, "parts, " + what);
    pb.check([&] { ASSERT_TRUE(cuda::bmm_tma(pb.io.a, kn, pb.io.y, caller_)); }, caller_, "[K, N], " + what);
    for (const bool parts : {false, true}) {
      const cuda::Graph graph = launches_graph(parts ? pb.args : whole, 8, caller_);
      for (int rep = 0; rep < 3; ++rep)
        pb.check([&] { graph.replay(caller_); }, caller_, (parts ? "graph of parts, " : "graph of wholes, ") + what);
    }
  }
  cuda::detail::set_bmm_tma_tuning({});
}

// Weights copied into the ring before the previous kernel ends (BmmTmaTuning::early_copy): none
// (L2 only), a slot per consumer group (the default: a whole unit of 4 slots at K = 128, two units
// at K = 512) and the whole ring (several speculative units before the rank claim). Each mode on
// both MLA shapes: unpartitioned, partitioned with true ranks and with colliding ones (speculative
// units copied, then dropped), in graphs of back-to-back launches (the early copies overlap the
// previous launch), all bitwise equal to the first result.
TEST_F(CudaBmmTmaDomains, EveryEarlyCopyMode) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const Shape3 sh : {Shape3{128, 512, 128}, Shape3{128, 128, 512}})
    for (const int64_t M : {1, 24}) {
      TwoDomainProblem pb(sh.heads, M, sh.n, sh.k, sh.heads / 2);
      const cuda::detail::BmmTmaArgs whole = pb.whole();
      {  // the knob took effect: a smaller ring for the next launch beside, except at K = 512,
         // where half an SM has no room for two slots and the usual ring is kept
        cuda::detail::BmmTmaTuning beside;
        beside.beside_next = 1;
        cuda::detail::set_bmm_tma_tuning(beside);
        const int beside_slots = cuda::detail::bmm_tma_ring_slots(whole);
        cuda::detail::set_bmm_tma_tuning({});
        const int usual_slots = cuda::detail::bmm_tma_ring_slots(whole);
        if (sh.k == 128) EXPECT_LT(beside_slots, usual_slots) << "K 128, M " << M;
        else EXPECT_EQ(beside_slots, usual_slots) << "K " << sh.k << ", M " << M;
        EXPECT_GE(beside_slots, 2);
        // By default a launch over two domains sizes its ring for the next launch beside, one
        // over one domain does not.
        cuda::detail::BmmTmaTuning apart;
        apart.beside_next = 0;
        cuda::detail::set_bmm_tma_tuning(apart);
        const int split_apart = cuda::detail::bmm_tma_ring_slots(pb.args);
        cuda::detail::set_bmm_tma_tuning(beside);
        const int split_beside = cuda::detail::bmm_tma_ring_slots(pb.args);
        cuda::detail::set_bmm_tma_tuning({});
        EXPECT_EQ(cuda::detail::bmm_tma_ring_slots(pb.args), split_beside) << "K " << sh.k << ", M " << M;
        if (sh.k == 128) EXPECT_LT(split_beside, split_apart) << "K 128, M " << M;
      }
      Tensor first;  // the first result, which every other must equal bitwise
      // Early copies of 0, 2 and 8 slots; and 2 with the ring sized for the next launch beside.
      for (const auto [mode, beside] : {std::pair{0, 0}, {2, 0}, {8, 0}, {2, 1}})
        for (const int form : {0, 1, 2}) {  // whole, true ranks, colliding ranks
          cuda::detail::BmmTmaTuning tuning;
          tuning.early_copy = mode;
          tuning.beside_next = beside;
          cuda::detail::set_bmm_tma_tuning(tuning);
          const Tensor tables = form == 2 ? set_rank_tables(pb.args, sms, domain_0, one_of_four)
                                          : set_rank_tables(pb.args, sms, sm_parity, half_sm);
          const cuda::detail::BmmTmaArgs& a = form == 0 ? whole : pb.args;
          const std::string what = std::to_string(sh.n) + " x " + std::to_string(sh.k) + " M " + std::to_string(M) +
                                   " mode " + std::to_string(mode) + (beside ? " beside next" : "") + " form " +
                                   std::to_string(form);
          const cuda::Graph graph = launches_graph(a, 6, caller_);
          for (int rep = 0; rep < 3; ++rep) {
            pb.check([&] { rep == 0 ? cuda::detail::launch_bmm_tma(a, caller_) : graph.replay(caller_); }, caller_,
                     what + " run " + std::to_string(rep));
            const Tensor got = fetch(pb.io.out);
            if (!first.defined()) first = got;
            else EXPECT_EQ(std::memcmp(got.data_ptr(), first.data_ptr(), got.nbytes()), 0) << what << " run " << rep;
          }
        }
      cuda::detail::set_bmm_tma_tuning({});
    }
}

// Two CTAs of one launch never share an SM, whatever its ring (sized for the next launch beside
// it or not, small at K = 64): twice the shared memory it asks for, with the runtime's reserve per
// CTA, is more than an SM has. Where the knob asks for two CTAs an SM (one domain), they fit (or
// the problem is not taken: 0 bytes).
TEST_F(CudaBmmTmaDomains, OneCtaOfALaunchAnSmWhateverItsRing) {
  int sm_bytes = 0, reserved = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0), cudaSuccess);
  for (const Shape3 sh : {Shape3{128, 512, 128}, Shape3{128, 128, 512}, Shape3{16, 512, 64}})
    for (const int64_t M : {1, 24, 64}) {
      TwoDomainProblem pb(sh.heads, M, sh.n, sh.k, sh.heads / 2);
      for (const int beside : {-1, 0, 1}) {
        cuda::detail::BmmTmaTuning tuning;
        tuning.beside_next = beside;
        cuda::detail::set_bmm_tma_tuning(tuning);
        for (const bool parts : {false, true}) {
          const cuda::detail::BmmTmaArgs a = parts ? pb.args : pb.whole();
          const int bytes = cuda::detail::bmm_tma_smem_bytes(a);
          EXPECT_GT(2 * (bytes + reserved), sm_bytes)
              << "H " << sh.heads << " N " << sh.n << " K " << sh.k << " M " << M << " beside " << beside
              << (parts ? " parts" : " whole") << ": " << bytes << " bytes";
        }
      }
      cuda::detail::BmmTmaTuning two;
      two.ctas_per_sm = 2;
      cuda::detail::set_bmm_tma_tuning(two);
      const int bytes = cuda::detail::bmm_tma_smem_bytes(pb.whole());
      EXPECT_TRUE(bytes == 0 || 2 * (bytes + reserved) <= sm_bytes)
          << "two CTAs an SM, K " << sh.k << " M " << M << ": " << bytes;
      cuda::detail::set_bmm_tma_tuning({});
    }
}

}  // namespace
}  // namespace locus
