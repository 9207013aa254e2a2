// MoE routing ops and the MoE module on CUDA against the CPU (whose ops are tested against fp64 in
// tests/modules): moe_route (V3 sigmoid + bias + group-limited top-k, V2 softmax; near-ties of
// the selection scores excluded explicitly), moe_group (bit-identical, bad device ids skipped and
// marked), moe_gather (bit-identical, bad device rows zero-filled), moe_combine (vs fp64), and the
// module with BF16 and NVFP4 experts, shared experts, locality domains off and on (2 emulated
// green-context domains), also on a non-blocking stream. The four ops capture into a CUDA graph;
// the host read of the offsets refuses a capturing stream. Outputs are poisoned first.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>

#include "cuda_locality_util.h"
#include "cuda_test_util.h"
#include "modules/moe.h"
#include "modules/moe_test_util.h"
#include "ops/moe_routing.h"

namespace locus::testing {
namespace {

using modules::MoE;
using modules::MoeConfig;
using ops::MoeRoutingConfig;
using ops::MoeScoring;

// ---------------------------------------------------------------------------------------------
// routing near-ties

// The smallest gap, in fp64, between consecutive selection scores that decide the routing of one
// token: the last kept and the first dropped group score, and the kept experts' scores in order
// down to the first dropped one (the order of the chosen ids is part of the output). Two correct
// fp32 implementations may disagree only where this gap is within their rounding differences.
double route_margin(const std::vector<double>& logits, const std::vector<double>& bias, const MoeRoutingConfig& c) {
  const int64_t E = c.num_experts, G = c.n_group, gs = E / G;
  std::vector<double> s(E), sel(E);
  if (c.scoring == MoeScoring::kSigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += s[e] = std::exp(logits[e] - mx);
    for (double& v : s) v /= sum;
  }
  for (int64_t e = 0; e < E; ++e) sel[e] = s[e] + (bias.empty() ? 0.0 : bias[e]);
  double margin = INFINITY;
  std::vector<bool> kept(G, true);
  if (G > 1 && c.topk_group < G) {
    std::vector<double> score(G);
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      score[g] = c.scoring == MoeScoring::kSigmoid && gs >= 2 ? v[0] + v[1] : v[0];
    }
    std::vector<int64_t> order(G);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    margin = score[order[c.topk_group - 1]] - score[order[c.topk_group]];
    for (int64_t i = c.topk_group; i < G; ++i) kept[order[i]] = false;
  }
  std::vector<double> cand;
  for (int64_t e = 0; e < E; ++e)
    if (kept[e / gs]) cand.push_back(sel[e]);
  std::sort(cand.rbegin(), cand.rend());
  for (int64_t j = 0; j < c.top_k && j + 1 < static_cast<int64_t>(cand.size()); ++j)
    margin = std::min(margin, cand[j] - cand[j + 1]);
  return margin;
}

// Tokens whose routing is a near-tie are left out of the comparisons; a test must keep most of
// them so that it cannot pass by excluding everything.
void expect_few_excluded(int64_t excluded, int64_t tokens) {
  EXPECT_LE(excluded, tokens / 10 + 2) << excluded << " of " << tokens << " tokens had routing near-ties";
}

// ---------------------------------------------------------------------------------------------
// ops

// A device copy of a CPU [rows, cols] tensor whose rows lie `pad` elements apart beyond cols
// (exercises the row strides).
Tensor padded_gpu(const Tensor& t, int64_t pad) {
  Tensor wide = Tensor::empty({t.size(0), t.size(1) + pad}, t.dtype(), Device::cuda(0));
  wide.fill_nan_();
  Tensor view = wide.slice(1, 0, t.size(1));
  view.copy_(t);
  return view;
}

TEST(CudaMoeOps, RouteChoosesTheCpuExpertsExceptAtNearTies) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  struct Case {
    MoeRoutingConfig cfg;
    bool bias;
  };
  const std::vector<Case> cases = {
      {routing_config(256, 8, 8, 4, 2.5f, MoeScoring::kSigmoid, true), true},    // DeepSeek-V3
      {routing_config(64, 6, 1, 1, 1.f, MoeScoring::kSigmoid, true), true},      // no group limit
      {routing_config(15, 3, 5, 2, 1.5f, MoeScoring::kSigmoid, true), true},     // odd groups of 3
      {routing_config(6, 3, 3, 2, 1.f, MoeScoring::kSigmoid, false), false},     // groups of 2, no bias
      {routing_config(7, 2, 7, 3, 2.f, MoeScoring::kSigmoid, true), true},       // one expert per group
      {routing_config(160, 6, 8, 3, 16.f, MoeScoring::kSoftmax, false), false},  // DeepSeek-V2
      {routing_config(64, 6, 1, 1, 1.f, MoeScoring::kSoftmax, false), false},    // DeepSeek-V2-Lite
      {routing_config(9, 2, 3, 2, 1.f, MoeScoring::kSoftmax, true), true},       // odd softmax with bias
  };
  // CPU and GPU compute every score with the same fp32 operations in the same order; only expf
  // differs (device: at most 2 ulp; host: under 1 ulp), which moves a score by a few ulp of
  // values below 2 (< 1e-6). 1e-5 is the near-tie margin: 10x that difference.
  const double kTie = 1e-5;
  // Weights: each passes through at most 6 rounded fp32 operations per side, plus the expf
  // difference: within (6 + 2) * 2 * 2^-24 ~ 1e-6 relative; 2e-6 bounds the normwise error.
  const double kWeightTol = 2e-6;
  int case_index = 0;
  for (const Case& cs : cases) {
    const MoeRoutingConfig& c = cs.cfg;
    SCOPED_TRACE(::testing::Message() << "case " << case_index++ << ": E=" << c.num_experts << " k=" << c.top_k
                                      << " groups " << c.topk_group << "/" << c.n_group);
    for (int64_t T : {1, 7, 128, 512}) {
      SCOPED_TRACE(T);
      const uint64_t s = seed + 1000 * case_index + T;
      const int64_t E = c.num_experts, K = c.top_k;
      const Tensor logits = randn({T, E}, DType::kFP32, s, 2.0);
      const Tensor bias = cs.bias ? randn({E}, DType::kFP32, s + 1, 0.3) : Tensor();
      Tensor w_cpu = Tensor::empty({T, K}, DType::kFP32), ids_cpu = Tensor::empty({T, K}, DType::kI32);
      ops::moe_route(logits, bias, c, w_cpu, ids_cpu);
      Tensor w_gpu = poisoned_gpu({T, K}, DType::kFP32), ids_gpu = poisoned_gpu({T, K}, DType::kI32);
      ops::moe_route(padded_gpu(logits, 3), cs.bias ? to_gpu(bias) : Tensor(), c, w_gpu, ids_gpu);
      const Tensor w = fetch(w_gpu), ids = fetch(ids_gpu);
      const std::vector<double> b = cs.bias ? to_doubles(bias) : std::vector<double>();
      std::vector<double> got_w, ref_w;
      int64_t excluded = 0;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> row(logits.data<float>() + t * E, logits.data<float>() + (t + 1) * E);
        if (route_margin(row, b, c) < kTie) {
          ++excluded;
          continue;
        }
        for (int64_t j = 0; j < K; ++j) {
          EXPECT_EQ(ids.data<int32_t>()[t * K + j], ids_cpu.data<int32_t>()[t * K + j]) << "token " << t << " slot " << j;
          got_w.push_back(w.data<float>()[t * K + j]);
          ref_w.push_back(w_cpu.data<float>()[t * K + j]);
        }
      }
      expect_few_excluded(excluded, T);
      if (!ref_w.empty()) EXPECT_LT(rel_error(got_w, ref_w), kWeightTol);
    }
  }
}

TEST(CudaMoeOps, RouteBeyondTheKernelLimitsIsAnError) {
  LOCUS_REQUIRE_GPU();
  const MoeRoutingConfig c = routing_config(1024, 8, 8, 4, 1.f, MoeScoring::kSigmoid, true);
  Tensor logits = Tensor::zeros({2, 1024}, DType::kFP32, Device::cuda(0));
  Tensor w = poisoned_gpu({2, 8}, DType::kFP32), ids = poisoned_gpu({2, 8}, DType::kI32);
  try {
    ops::moe_route(logits, Tensor(), c, w, ids);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts=1024"), std::string::npos) << e.what();
  }
}

// ids [T, K] in [0, E), skewed so that some experts get many pairs and others none.
Tensor random_ids(int64_t T, int64_t K, int64_t E, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor ids = Tensor::empty({T, K}, DType::kI32);
  for (int64_t i = 0; i < T * K; ++i)
    ids.data<int32_t>()[i] = static_cast<int32_t>(rng() % 2 ? rng() % (E / 4 + 1) : rng() % E);
  return ids;
}

struct Grouping {
  Tensor offsets, rows, slot;
};
Grouping group_on(const Tensor& ids, int64_t E, Device dev) {
  const int64_t T = ids.size(0), K = ids.size(1);
  Grouping g{Tensor::empty({E + 1}, DType::kI32, dev), Tensor::empty({T * K}, DType::kI32, dev),
             Tensor::empty({T, K}, DType::kI32, dev)};
  for (Tensor* t : {&g.offsets, &g.rows, &g.slot}) t->fill_nan_();  // 0xFF bytes: -1
  ops::moe_group(ids, E, g.offsets, g.rows, g.slot);
  if (dev.is_cpu()) return g;
  return {fetch(g.offsets), fetch(g.rows), fetch(g.slot)};
}

TEST(CudaMoeOps, GroupIsBitIdenticalToCpu) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (const auto& [E, K] : {std::pair<int64_t, int64_t>{256, 8}, {7, 3}, {1, 1}, {300, 4}}) {
    for (int64_t T : {1, 5, 64, 512, 4096}) {
      SCOPED_TRACE(::testing::Message() << "E=" << E << " k=" << K << " T=" << T);
      const Tensor ids = random_ids(T, K, E, seed + T * 7 + E);
      const Grouping want = group_on(ids, E, Device::cpu());
      // The GPU reads ids with a row stride wider than k.
      Tensor wide = Tensor::empty({T, K + 2}, DType::kI32, Device::cuda(0));
      Tensor ids_gpu = wide.slice(1, 0, K);
      ids_gpu.copy_(ids);
      const Grouping got = group_on(ids_gpu, E, Device::cuda(0));
      EXPECT_TRUE(bitwise_equal(got.offsets, want.offsets));
      EXPECT_TRUE(bitwise_equal(got.rows, want.rows));
      EXPECT_TRUE(bitwise_equal(got.slot, want.slot));
    }
  }
}

// Device ids outside [0, E) are skipped and marked: not counted, slot -1, rows past offsets[E]
// are -1; the valid pairs are grouped as if the bad ones were absent.
TEST(CudaMoeOps, GroupSkipsOutOfRangeDeviceIds) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t T = 300, K = 4, E = 16;
  Tensor ids = random_ids(T, K, E, seed);
  std::mt19937_64 rng(seed + 1);
  const int32_t bad[] = {-1, static_cast<int32_t>(E), INT_MIN, INT_MAX, 1000};
  for (int i = 0; i < 60; ++i) ids.data<int32_t>()[rng() % (T * K)] = bad[rng() % 5];
  const Grouping got = group_on(to_gpu(ids), E, Device::cuda(0));

  std::vector<int32_t> offsets(E + 1, 0), rows(T * K, -1), slot(T * K, -1);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < T * K; ++i)
    if (id[i] >= 0 && id[i] < E) ++offsets[id[i] + 1];
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < T * K; ++i)
    if (id[i] >= 0 && id[i] < E) {
      slot[i] = next[id[i]]++;
      rows[slot[i]] = static_cast<int32_t>(i / K);
    }
  ASSERT_LT(offsets[E], T * K);  // some pairs were bad
  auto values = [](const Tensor& t) { return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel()); };
  EXPECT_EQ(values(got.offsets), offsets);
  EXPECT_EQ(values(got.rows), rows);
  EXPECT_EQ(values(got.slot), slot);
}

// The offsets' read-back waits only for the work queued before it: with about 30 ms of writes
// queued after it, wait() returns the grouping's offsets while those writes still run. Several
// read-backs in flight at once each get their own pinned block.
TEST(CudaMoeOps, OffsetsReadbackDoesNotWaitForLaterWork) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t T = 64, K = 8, E = 256;
  const Tensor ids = random_ids(T, K, E, seed);
  const Grouping want = group_on(ids, E, Device::cpu());
  cudaStream_t raw = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  const Stream stream{Device::cuda(0), raw};
  Tensor big = Tensor::empty({int64_t{1} << 30}, DType::kU8, Device::cuda(0));
  {
    const Tensor ids_gpu = to_gpu(ids);
    std::vector<Tensor> offsets;
    std::vector<std::unique_ptr<ops::MoeOffsetsReadback>> reads;
    for (int i = 0; i < 3; ++i) {
      offsets.push_back(Tensor::empty({E + 1}, DType::kI32, Device::cuda(0)));
      Tensor rows = Tensor::empty({T * K}, DType::kI32, Device::cuda(0));
      Tensor slot = Tensor::empty({T, K}, DType::kI32, Device::cuda(0));
      ops::moe_group(ids_gpu, E, offsets.back(), rows, slot, stream);
      reads.push_back(std::make_unique<ops::MoeOffsetsReadback>(offsets.back(), stream));
    }
    for (int i = 0; i < 100; ++i)
      ASSERT_EQ(cudaMemsetAsync(big.data_ptr(), i, static_cast<size_t>(big.nbytes()), raw), cudaSuccess);
    for (auto& r : reads) {
      const std::vector<int64_t> got = r->wait();
      ASSERT_EQ(got.size(), static_cast<size_t>(E + 1));
      for (int64_t e = 0; e <= E; ++e) EXPECT_EQ(got[e], want.offsets.data<int32_t>()[e]) << e;
    }
    EXPECT_EQ(cudaStreamQuery(raw), cudaErrorNotReady) << "the read-back waited for the writes queued after it";
  }
  ASSERT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
  cudaStreamDestroy(raw);
}

TEST(CudaMoeOps, GatherIsBitIdenticalToCpuAndZeroFillsBadDeviceRows) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  // Widths and paddings that select each copy width (16, 4, 2 bytes).
  for (const auto& [dtype, H, pad] : {std::tuple{DType::kBF16, int64_t{7168}, int64_t{0}}, std::tuple{DType::kBF16, int64_t{13}, int64_t{0}},
                                      std::tuple{DType::kBF16, int64_t{64}, int64_t{1}}, std::tuple{DType::kFP32, int64_t{33}, int64_t{3}}}) {
    for (int64_t T : {1, 37, 512}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " H=" << H << " pad=" << pad << " T=" << T);
      const int64_t R = T * 3;
      const Tensor x = randn({T, H}, dtype, rng());
      Tensor rows = Tensor::empty({R}, DType::kI32);
      for (int64_t i = 0; i < R; ++i) rows.data<int32_t>()[i] = static_cast<int32_t>(rng() % T);
      Tensor want = Tensor::empty({R, H}, dtype);
      ops::moe_gather(x, rows, want);
      Tensor y = poisoned_gpu({R, H + pad}, dtype).slice(1, 0, H);
      ops::moe_gather(padded_gpu(x, pad), to_gpu(rows), y);
      EXPECT_TRUE(bitwise_equal(fetch(y), want));

      // Bad device rows: zero rows, the others unchanged.
      Tensor bad_rows = rows.clone();
      bad_rows.data<int32_t>()[0] = -1;
      bad_rows.data<int32_t>()[R - 1] = static_cast<int32_t>(T);
      Tensor y2 = poisoned_gpu({R, H}, dtype);
      ops::moe_gather(to_gpu(x), to_gpu(bad_rows), y2);
      const Tensor got = fetch(y2);
      const Tensor zero = Tensor::zeros({1, H}, dtype);
      EXPECT_TRUE(bitwise_equal(got.slice(0, 0, 1), zero));
      EXPECT_TRUE(bitwise_equal(got.slice(0, R - 1, R), zero));
      if (R > 2) EXPECT_TRUE(bitwise_equal(got.slice(0, 1, R - 1), want.slice(0, 1, R - 1)));
    }
  }
}

TEST(CudaMoeOps, CombineMatchesFp64AndCpu) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int64_t K = 8;
  for (int64_t T : {1, 37, 256}) {
    for (const int64_t H : {int64_t{7168}, int64_t{100}}) {
      const int64_t R = T * K;
      // slot: a permutation of the rows with some choices skipped (-1, for CPU and GPU alike).
      std::vector<int32_t> perm(R);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      Tensor slot = Tensor::empty({T, K}, DType::kI32);
      for (int64_t i = 0; i < R; ++i) slot.data<int32_t>()[i] = rng() % 7 == 0 ? -1 : perm[i];
      // On the device some skipped choices carry out-of-range rows instead; they must be skipped too.
      Tensor slot_dev = slot.clone();
      for (int64_t i = 0; i < R; ++i)
        if (slot_dev.data<int32_t>()[i] == -1 && rng() % 2) slot_dev.data<int32_t>()[i] = rng() % 2 ? static_cast<int32_t>(R) : -7;
      const Tensor weights = randn({T, K}, DType::kFP32, rng());
      const std::vector<double> wv = to_doubles(weights);
      for (DType eo_t : {DType::kBF16, DType::kFP32}) {
        const Tensor eo = randn({R, H}, eo_t, rng()), eo_gpu = to_gpu(eo);
        const std::vector<double> eov = to_doubles(eo);
        for (int shared_kind : {0, 1, 2}) {  // none, bf16, fp32
          const Tensor shared =
              shared_kind == 0 ? Tensor() : randn({T, H}, shared_kind == 1 ? DType::kBF16 : DType::kFP32, rng());
          const std::vector<double> sv = shared.defined() ? to_doubles(shared) : std::vector<double>();
          std::vector<double> ref(static_cast<size_t>(T * H), 0.0);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < H; ++c) {
              double v = sv.empty() ? 0.0 : sv[t * H + c];
              for (int64_t j = 0; j < K; ++j) {
                const int32_t r = slot.data<int32_t>()[t * K + j];
                if (r >= 0) v += wv[t * K + j] * eov[r * H + c];
              }
              ref[t * H + c] = v;
            }
          for (DType y_t : {DType::kBF16, DType::kFP32}) {
            SCOPED_TRACE(::testing::Message() << "T=" << T << " H=" << H << " eo " << dtype_name(eo_t) << " shared "
                                              << shared_kind << " y " << dtype_name(y_t));
            Tensor y_cpu = Tensor::empty({T, H}, y_t);
            ops::moe_combine(eo, slot, weights, shared, y_cpu);
            Tensor y = poisoned_gpu({T, H}, y_t);
            ops::moe_combine(eo_gpu, to_gpu(slot_dev), to_gpu(weights), shared.defined() ? to_gpu(shared) : Tensor(), y);
            // fp32 sums of at most 9 terms: a few 2^-24 relative; a bf16 output adds its rounding.
            const double tol = (y_t == DType::kBF16 ? kBf16RoundingBound : 0.0) + 1e-6;
            const Tensor got = fetch(y);
            EXPECT_LT(rel_error(got, ref), tol);
            EXPECT_LT(rel_error(got, to_doubles(y_cpu)), tol);
          }
        }
      }
    }
  }
}

// Routing, grouping, gather and combine on a caller's stream inside a CUDA graph: capture must
// succeed (the ops only enqueue kernels) and each replay must reproduce the eager results bit for
// bit (no atomics, fixed orders). Reading the offsets back is refused while capturing.
TEST(CudaMoeOps, RoutingOpsCaptureIntoAGraphAndReplayTheEagerResults) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const Device dev = Device::cuda(0);
  const int64_t T = 24, E = 256, K = 8, H = 512, R = T * K;
  const MoeRoutingConfig c = routing_config(E, K, 8, 4, 2.5f);
  const Tensor logits = randn({T, E}, DType::kFP32, seed, 2.0).to(dev), bias = randn({E}, DType::kFP32, seed + 1, 0.3).to(dev);
  const Tensor x = randn({T, H}, DType::kBF16, seed + 2).to(dev), shared = randn({T, H}, DType::kBF16, seed + 3).to(dev);
  struct Outputs {
    Tensor w, ids, offsets, rows, slot, xg, y;
    explicit Outputs(Device d)
        : w(Tensor::empty({T, K}, DType::kFP32, d)), ids(Tensor::empty({T, K}, DType::kI32, d)),
          offsets(Tensor::empty({E + 1}, DType::kI32, d)), rows(Tensor::empty({R}, DType::kI32, d)),
          slot(Tensor::empty({T, K}, DType::kI32, d)), xg(Tensor::empty({R, H}, DType::kBF16, d)),
          y(Tensor::empty({T, H}, DType::kBF16, d)) {}
    std::vector<Tensor> all() const { return {w, ids, offsets, rows, slot, xg, y}; }
    void poison() const {
      for (Tensor t : all()) t.fill_nan_();
    }
  };
  // The gathered rows stand in for the expert outputs: y = shared + sum_j w_j x[t] (in bf16).
  auto run_ops = [&](const Outputs& o, const Stream& s) {
    ops::moe_route(logits, bias, c, o.w, o.ids, s);
    ops::moe_group(o.ids, E, o.offsets, o.rows, o.slot, s);
    ops::moe_gather(x, o.rows, o.xg, s);
    ops::moe_combine(o.xg, o.slot, o.w, shared, o.y, s);
  };
  cudaStream_t raw = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  const Stream stream{dev, raw};
  const Outputs eager(dev);
  eager.poison();
  run_ops(eager, stream);
  cuda::device_synchronize(0);
  {
    const Outputs graphed(dev);
    cuda::Graph graph;
    graph.begin_capture(raw);
    run_ops(graphed, stream);
    EXPECT_THROW(ops::moe_offsets_to_host(graphed.offsets, stream), Error);  // enqueues nothing
    graph.end_capture();
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE(replay);
      graphed.poison();
      graph.replay(raw);
      const std::vector<Tensor> got = graphed.all(), want = eager.all();
      for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(bitwise_equal(fetch(got[i]), fetch(want[i]))) << i;
    }
    // Outside a capture the read-back works and gives the grouping's offsets.
    const std::vector<int64_t> off = ops::moe_offsets_to_host(graphed.offsets, stream);
    ASSERT_EQ(off.size(), static_cast<size_t>(E + 1));
    EXPECT_EQ(off[0], 0);
    EXPECT_EQ(off[E], R);
    const Tensor want_off = fetch(eager.offsets);
    for (int64_t e = 0; e <= E; ++e) EXPECT_EQ(off[e], want_off.data<int32_t>()[e]) << e;
  }
  cudaStreamDestroy(raw);
}

// ---------------------------------------------------------------------------------------------
// the module

class CudaMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCUS_REQUIRE_GPU();
    ld_ = CudaLocality::emulated(2);
  }
  modules::ModuleContext ctx(bool ld, Device d) const { return ld_.ctx("model.layers.3.mlp", ld, d); }
  static MoeConfig config(locality::QuantKind quant) {
    MoeConfig c;
    c.hidden_size = 256;  // NVFP4 halves along I and H need 128-row multiples
    c.intermediate_size = 256;
    c.num_experts = 16;
    c.top_k = 4;
    c.n_group = 4;
    c.topk_group = 2;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.5f;
    c.n_shared_experts = 1;
    c.expert_quant = quant;
    c.shared_quant = quant;
    return c;
  }
  static Tensor run(const MoE& m, const Tensor& x) {
    Tensor y = Tensor::empty({x.size(0), m.config().hidden_size}, DType::kBF16, x.device());
    y.fill_nan_();
    m.forward(x, y);
    return y.device().is_cpu() ? y : fetch(y);
  }
  // Builds a CPU module, a GPU module with locality off and one with 2 domains, all loaded with
  // the same pieces, and checks each GPU output against the CPU output on the tokens whose
  // routing is not a near-tie.
  void compare(const MoeConfig& c, const modules::WeightMap& pieces, const MoeWeights& w, uint64_t seed);

  CudaLocality ld_;
};

void CudaMoe::compare(const MoeConfig& c, const modules::WeightMap& pieces, const MoeWeights& w, uint64_t seed) {
  const Device dev = Device::cuda(0);
  MoE cpu(ctx(false, Device::cpu()), c), off(ctx(false, dev), c), on(ctx(true, dev), c);
  for (MoE* m : {&cpu, &off, &on}) {
    for (const auto& [k, v] : pieces) m->load(k, v);
    m->localize();
  }
  ASSERT_FALSE(off.experts_plan().enabled);
  ASSERT_TRUE(on.experts_plan().enabled) << on.experts_plan().describe();
  ASSERT_TRUE(on.expert_gate_up(0).partitioned());
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.top_k;
  const std::vector<double> gate = to_doubles(w.gate), bias = to_doubles(w.bias);
  for (int64_t T : {1, 64, 200}) {
    SCOPED_TRACE(T);
    const Tensor x = randn({T, H}, DType::kBF16, seed + T), xd = x.to(dev);
    Tensor logits = Tensor::empty({T, E}, DType::kFP32);
    cpu.gate().forward(x, logits);
    // Near-ties: the GPU router gate and the CPU's sum the same bf16 products in fp32 in
    // different orders, each within H * u * sum_k |x_k g_k| of the exact logit (u = 2^-23 covers
    // truncating tensor-core adders), so they differ by at most twice that, d. A sigmoid score
    // moves by at most d / 4, a gap between two group scores (two experts each) by at most d.
    const std::vector<double> xv = to_doubles(x);
    std::vector<bool> compared(T, true);
    int64_t excluded = 0;
    for (int64_t t = 0; t < T; ++t) {
      double abs_dot = 0;
      for (int64_t e = 0; e < E; ++e) {
        double s = 0;
        for (int64_t k = 0; k < H; ++k) s += std::abs(xv[t * H + k] * gate[e * H + k]);
        abs_dot = std::max(abs_dot, s);
      }
      const double bound = 2.0 * static_cast<double>(H) * 0x1p-23 * abs_dot;
      std::vector<double> row(logits.data<float>() + t * E, logits.data<float>() + (t + 1) * E);
      if (route_margin(row, bias, on.routing_config()) < bound) {
        compared[t] = false;
        ++excluded;
      }
    }
    expect_few_excluded(excluded, T);

    Tensor rw = Tensor::empty({T, K}, DType::kFP32), ids = Tensor::empty({T, K}, DType::kI32);
    cpu.route(x, rw, ids);
    Tensor ids_gpu = poisoned_gpu({T, K}, DType::kI32), rw_gpu = poisoned_gpu({T, K}, DType::kFP32);
    on.route(xd, rw_gpu, ids_gpu);
    const Tensor ids_back = fetch(ids_gpu);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K && compared[t]; ++j)
        EXPECT_EQ(ids_back.data<int32_t>()[t * K + j], ids.data<int32_t>()[t * K + j]) << "token " << t;
    const Tensor y_cpu = run(cpu, x);
    // Also on a non-blocking stream: the offsets read-back must wait for that stream's work.
    cudaStream_t raw = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
    Tensor y_stream = poisoned_gpu({T, H}, DType::kBF16);
    off.forward(xd, y_stream, Stream{dev, raw});
    std::vector<Tensor> outs = {run(off, xd), run(on, xd), fetch(y_stream)};
    cudaStreamDestroy(raw);
    // Each routed and shared term is two chained bf16 products (h rounded to bf16 between them,
    // y rounded once), as in the GatedMLP test; the routing weights differ by ~1e-6 relative.
    const double tol = bf16_gemm_tolerance(H) + bf16_gemm_tolerance(c.intermediate_size);
    for (size_t o = 0; o < outs.size(); ++o) {
      SCOPED_TRACE(o == 0 ? "locality off" : o == 1 ? "locality on (2 domains)" : "locality off, non-blocking stream");
      std::vector<double> got, ref;
      for (int64_t t = 0; t < T; ++t) {
        if (!compared[t]) continue;
        for (int64_t i = 0; i < H; ++i) {
          got.push_back(get(outs[o], t * H + i));
          ref.push_back(get(y_cpu, t * H + i));
        }
      }
      EXPECT_LT(rel_error(got, ref), tol);
    }
  }
}

TEST_F(CudaMoe, Bf16ExpertsWithSharedExpertsMatchCpuLdOffAndOn) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MoeConfig c = config(locality::QuantKind::kBF16);
  // Logits ~ N(0, 1) (gate std 1/sqrt(H)) so that the sigmoid scores spread out.
  const MoeWeights w(c, seed, 1.0 / 16, 1.0 / 16);
  compare(c, w.per_expert(), w, seed + 100);
}

// NVFP4 checkpoint pieces of `w`: gate and up with one global scale (as ModelOpt's DeepSeek export
// writes them: the fused weight takes one launch) or, with up_scale_factor != 1, the up halves
// with a global scale of their own (the per-half-scale path).
modules::WeightMap nvfp4_moe_pieces(const MoeConfig& c, const MoeWeights& w, float up_scale_factor) {
  modules::WeightMap pieces{{"gate.weight", w.gate}, {"gate.e_score_correction_bias", w.bias}};
  auto add = [&](const std::string& prefix, const Tensor& t, float global) {
    const ops::Nvfp4Weight q = ops::nvfp4_quantize(t, global);
    pieces[prefix + "weight"] = q.packed;
    pieces[prefix + "weight_scale"] = q.scales;
    Tensor s = Tensor::empty({}, DType::kFP32);
    s.data<float>()[0] = q.global_scale;
    pieces[prefix + "weight_scale_2"] = s;
  };
  auto add_mlp = [&](const std::string& prefix, const Tensor& g, const Tensor& u, const Tensor& d) {
    const float gs = ops::nvfp4_global_scale_for(g), us = ops::nvfp4_global_scale_for(u);
    const float shared = std::max(gs, us);
    add(prefix + "gate_proj.", g, up_scale_factor == 1.f ? shared : gs);
    add(prefix + "up_proj.", u, up_scale_factor == 1.f ? shared : us * up_scale_factor);
    add(prefix + "down_proj.", d, ops::nvfp4_global_scale_for(d));
  };
  for (int64_t e = 0; e < c.num_experts; ++e) add_mlp(str("experts.", e, "."), w.g[e], w.u[e], w.d[e]);
  add_mlp("shared_experts.", w.sg, w.su, w.sd);
  return pieces;
}

TEST_F(CudaMoe, Nvfp4ExpertsWithSharedExpertsMatchCpuLdOffAndOn) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MoeConfig c = config(locality::QuantKind::kNVFP4);
  const MoeWeights w(c, seed, 1.0 / 16, 1.0 / 16);
  compare(c, nvfp4_moe_pieces(c, w, 1.5f), w, seed + 100);
}

// Fused gate/up weights (one global scale), with the experts' row-block launches (the default:
// experts with equal row counts share launches of the streaming kernel,
// ops::nvfp4_gemm_row_blocks) and without them (one launch per expert, LOCUS_NVFP4_ROW_BLOCKS=0).
TEST_F(CudaMoe, Nvfp4ExpertsSharingLaunchesOrNotMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MoeConfig c = config(locality::QuantKind::kNVFP4);
  const MoeWeights w(c, seed, 1.0 / 16, 1.0 / 16);
  const bool was = cuda::nvfp4_row_block_launches();
  for (const bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "row-block launches" : "one launch per expert");
    cuda::set_nvfp4_row_block_launches(shared);
    compare(c, nvfp4_moe_pieces(c, w, 1.f), w, seed + 100);
  }
  cuda::set_nvfp4_row_block_launches(was);
}

// Decode with few (token, choice) pairs per expert (T = 1 here: 4 pairs over 16 experts) takes
// the NVFP4 experts by id on the device (ops::nvfp4_gemm_indexed, no offsets read back); the
// same module with that off (LOCUS_MOE_INDEXED=0) groups the pairs by expert. Both match the CPU.
TEST_F(CudaMoe, Nvfp4ExpertsByIdOnTheDeviceOrGroupedMatchCpu) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const MoeConfig c = config(locality::QuantKind::kNVFP4);
  const MoeWeights w(c, seed, 1.0 / 16, 1.0 / 16);
  const bool was = modules::moe_indexed_experts();
  for (const bool indexed : {true, false}) {
    SCOPED_TRACE(indexed ? "experts by id on the device" : "grouped by expert");
    modules::set_moe_indexed_experts(indexed);
    compare(c, nvfp4_moe_pieces(c, w, 1.f), w, seed + 100);
  }
  modules::set_moe_indexed_experts(was);
}

}  // namespace
}  // namespace locus::testing
