// DeepSeek routing (ops::moe_route) against hand-computed examples, where group masking and the
// -inf fill decide the result, and against an fp64 implementation on random logits; plus the
// grouping (moe_group) and the gather / combine helpers.
#include "ops/moe_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>

#include "module_test_util.h"
#include "moe_test_util.h"

namespace locus::testing {
namespace {

using ops::MoeRoutingConfig;
using ops::MoeScoring;

Tensor fp32_rows(const std::vector<std::vector<double>>& rows) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, DType::kFP32);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j) t.data<float>()[i * rows[i].size() + j] = static_cast<float>(rows[i][j]);
  return t;
}

double logit(double p) { return std::log(p / (1 - p)); }

struct Routed {
  Tensor w, ids;
};
Routed route(const Tensor& logits, const Tensor& bias, const MoeRoutingConfig& c) {
  Routed r{Tensor::empty({logits.size(0), c.top_k}, DType::kFP32), Tensor::empty({logits.size(0), c.top_k}, DType::kI32)};
  r.w.fill_nan_();
  ops::moe_route(logits, bias, c, r.w, r.ids);
  return r;
}

// 8 experts in 4 groups of 2, keep 2 groups, top-2. Token 0: expert 0 has the best score but its
// group (0.9 + 0.1) loses to groups 1 (0.6 + 0.58) and 2 (0.55 + 0.55), so the answer is {2, 3}
// (without group limiting it would be {0, 2}). The bias only selects; the weights use the
// unbiased sigmoid scores. Token 1: group 0 now wins (0.9 + 0.8).
TEST(MoeRoutingTest, HandComputedGroupLimitedExample) {
  const std::vector<double> p0 = {0.9, 0.1, 0.5, 0.48, 0.45, 0.45, 0.2, 0.2};
  const std::vector<double> p1 = {0.9, 0.8, 0.5, 0.48, 0.45, 0.45, 0.2, 0.2};
  const std::vector<double> bias = {0, 0, 0.1, 0.1, 0.1, 0.1, 0, 0};
  std::vector<double> l0, l1;
  for (double p : p0) l0.push_back(logit(p));
  for (double p : p1) l1.push_back(logit(p));
  Tensor logits = fp32_rows({l0, l1});
  Tensor b = fp32_rows({bias}).view({8});
  const Routed r = route(logits, b, routing_config(8, 2, 4, 2, 2.5f));
  const int32_t* id = r.ids.data<int32_t>();
  const float* w = r.w.data<float>();
  EXPECT_EQ(id[0], 2);
  EXPECT_EQ(id[1], 3);
  EXPECT_NEAR(w[0], 0.5 / (0.5 + 0.48) * 2.5, 1e-5);
  EXPECT_NEAR(w[1], 0.48 / (0.5 + 0.48) * 2.5, 1e-5);
  EXPECT_EQ(id[2], 0);
  EXPECT_EQ(id[3], 1);
  EXPECT_NEAR(w[2], 0.9 / 1.7 * 2.5, 1e-5);
  EXPECT_NEAR(w[3], 0.8 / 1.7 * 2.5, 1e-5);
  // Without groups (n_group 1) token 0 picks the global top-2 by biased score: 0 (0.9) and 2 (0.6).
  const Routed flat = route(logits, b, routing_config(8, 2, 1, 1, 2.5f));
  EXPECT_EQ(flat.ids.data<int32_t>()[0], 0);
  EXPECT_EQ(flat.ids.data<int32_t>()[1], 2);

  // A negative bias on every expert makes all selection scores negative. Masked groups must be
  // -inf (a 0.0 fill, as in HF, would pick masked experts): the choice is unchanged.
  Tensor neg = Tensor::empty({8}, DType::kFP32);
  for (int e = 0; e < 8; ++e) neg.data<float>()[e] = static_cast<float>(bias[e] - 2.0);
  const Routed rn = route(logits, neg, routing_config(8, 2, 4, 2, 2.5f));
  EXPECT_EQ(rn.ids.data<int32_t>()[0], 2);
  EXPECT_EQ(rn.ids.data<int32_t>()[1], 3);
  EXPECT_NEAR(rn.w.data<float>()[0], w[0], 1e-6);
}

TEST(MoeRoutingTest, SoftmaxScoringWithoutRenormalization) {
  // V2-Lite style: softmax over the experts, plain top-k, weights = probabilities * scale.
  MoeRoutingConfig c;
  c.num_experts = 4;
  c.top_k = 2;
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.f;
  c.scoring = MoeScoring::kSoftmax;
  Tensor logits = fp32_rows({{1.0, 3.0, 2.0, 0.0}});
  const Routed r = route(logits, Tensor(), c);
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.0);
  EXPECT_EQ(r.ids.data<int32_t>()[0], 1);
  EXPECT_EQ(r.ids.data<int32_t>()[1], 2);
  EXPECT_NEAR(r.w.data<float>()[0], std::exp(3.0) / z, 1e-6);
  EXPECT_NEAR(r.w.data<float>()[1], std::exp(2.0) / z, 1e-6);
}

// fp64 implementation of the same rules.
void ref_route(const std::vector<double>& logits, const std::vector<double>& bias, const MoeRoutingConfig& c,
               std::vector<int>* ids, std::vector<double>* w) {
  const int64_t E = c.num_experts, G = c.n_group, gs = E / G;
  std::vector<double> s(E), sel(E);
  for (int64_t e = 0; e < E; ++e) {
    s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    sel[e] = s[e] + bias[e];
  }
  std::vector<double> gscore(G);
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
    std::sort(v.rbegin(), v.rend());
    gscore[g] = v[0] + v[1];
  }
  std::vector<int> order(G);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gscore[a] > gscore[b]; });
  std::vector<bool> keep(G, false);
  for (int64_t i = 0; i < c.topk_group; ++i) keep[order[i]] = true;
  std::vector<int> ex(E);
  std::iota(ex.begin(), ex.end(), 0);
  for (int64_t e = 0; e < E; ++e)
    if (!keep[e / gs]) sel[e] = -INFINITY;
  std::stable_sort(ex.begin(), ex.end(), [&](int a, int b) { return sel[a] > sel[b]; });
  ids->assign(ex.begin(), ex.begin() + c.top_k);
  double sum = 0;
  for (int id : *ids) sum += s[id];
  w->clear();
  for (int id : *ids) w->push_back(s[id] / (c.norm_topk_prob ? sum + 1e-20 : 1.0) * c.routed_scaling_factor);
}

TEST(MoeRoutingTest, MatchesFp64OnRandomLogits) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t T = 32, E = 16;
  const MoeRoutingConfig c = routing_config(E, 4, 4, 2, 2.5f);
  Tensor logits = randn({T, E}, DType::kFP32, seed, 2.0);
  Tensor bias = randn({E}, DType::kFP32, seed + 1, 0.3);
  const Routed r = route(logits, bias, c);
  std::vector<double> all_w, all_ref;
  const std::vector<double> b = to_doubles(bias);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> row(logits.data<float>() + t * E, logits.data<float>() + (t + 1) * E);
    std::vector<int> ids;
    std::vector<double> w;
    ref_route(row, b, c, &ids, &w);
    for (int j = 0; j < c.top_k; ++j) {
      EXPECT_EQ(r.ids.data<int32_t>()[t * c.top_k + j], ids[j]) << "token " << t << " slot " << j;
      all_w.push_back(r.w.data<float>()[t * c.top_k + j]);
      all_ref.push_back(w[j]);
    }
  }
  EXPECT_LT(rel_error(all_w, all_ref), 1e-6);
}

TEST(MoeRoutingTest, BadArgumentsAreErrors) {
  Tensor logits = Tensor::zeros({2, 8}, DType::kFP32);
  Tensor w = Tensor::empty({2, 2}, DType::kFP32), ids = Tensor::empty({2, 2}, DType::kI32);
  EXPECT_THROW(ops::moe_route(logits, Tensor(), routing_config(8, 2, 3, 1, 1.f), w, ids), Error);  // 3 does not divide 8
  EXPECT_THROW(ops::moe_route(logits, Tensor(), routing_config(8, 5, 4, 2, 1.f), w, ids), Error);  // 5 > 2 groups x 2
  EXPECT_THROW(ops::moe_route(logits, Tensor::zeros({7}, DType::kFP32), routing_config(8, 2, 4, 2, 1.f), w, ids), Error);
  EXPECT_THROW(ops::moe_route(Tensor::zeros({2, 8}, DType::kBF16), Tensor(), routing_config(8, 2, 4, 2, 1.f), w, ids), Error);
  Tensor x = Tensor::zeros({3, 4}, DType::kBF16), y = Tensor::empty({2, 4}, DType::kBF16);
  Tensor rows = Tensor::empty({2}, DType::kI32);
  rows.data<int32_t>()[0] = 0;
  rows.data<int32_t>()[1] = 3;  // out of range
  try {
    ops::moe_gather(x, rows, y);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows[1]=3"), std::string::npos) << e.what();
  }
}

TEST(MoeRoutingTest, GatherAndCombine) {
  const uint64_t seed = fresh_seed();
  Tensor x = randn({3, 8}, DType::kBF16, seed);
  Tensor rows = Tensor::empty({4}, DType::kI32);
  const int32_t r[4] = {2, 0, 2, 1};
  std::copy(r, r + 4, rows.data<int32_t>());
  Tensor g = Tensor::empty({4, 8}, DType::kBF16);
  g.fill_nan_();
  ops::moe_gather(x, rows, g);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(bitwise_equal(g.slice(0, i, i + 1), x.slice(0, r[i], r[i] + 1)));
  // y[t] = shared[t] + sum_j w[t, j] eo[slot[t, j]], slot -1 skipped.
  Tensor eo = randn({4, 8}, DType::kFP32, seed + 1), shared = randn({3, 8}, DType::kBF16, seed + 2);
  Tensor slot = Tensor::empty({3, 2}, DType::kI32), w = randn({3, 2}, DType::kFP32, seed + 3);
  const int32_t s[6] = {1, 3, 2, -1, 0, 1};
  std::copy(s, s + 6, slot.data<int32_t>());
  Tensor y = Tensor::empty({3, 8}, DType::kFP32);
  y.fill_nan_();
  ops::moe_combine(eo, slot, w, shared, y);
  std::vector<double> ref;
  for (int t = 0; t < 3; ++t)
    for (int c = 0; c < 8; ++c) {
      double v = get(shared, t * 8 + c);
      for (int j = 0; j < 2; ++j)
        if (s[t * 2 + j] >= 0) v += get(w, t * 2 + j) * get(eo, s[t * 2 + j] * 8 + c);
      ref.push_back(v);
    }
  EXPECT_LT(rel_error(y, ref), 1e-6);
}

struct Grouped {
  Tensor offsets, rows, slot;
};
Grouped group(const Tensor& ids, int64_t E) {
  Grouped g{Tensor::empty({E + 1}, DType::kI32), Tensor::empty({ids.size(0) * ids.size(1)}, DType::kI32),
            Tensor::empty({ids.size(0), ids.size(1)}, DType::kI32)};
  for (Tensor* t : {&g.offsets, &g.rows, &g.slot}) t->fill_nan_();  // 0xFF bytes: -1
  ops::moe_group(ids, E, g.offsets, g.rows, g.slot);
  return g;
}

Tensor i32_rows(const std::vector<std::vector<int32_t>>& rows) {
  Tensor t = Tensor::empty({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, DType::kI32);
  for (size_t i = 0; i < rows.size(); ++i) std::copy(rows[i].begin(), rows[i].end(), t.data<int32_t>() + i * rows[i].size());
  return t;
}

std::vector<int32_t> values(const Tensor& t) { return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel()); }

// 3 tokens, k = 2, 5 experts (1 and 4 get nothing). Pairs in (t, j) order: (0,0)->3, (0,1)->0,
// (1,0)->0, (1,1)->3, (2,0)->2, (2,1)->0. Expert 0 holds tokens 0, 1, 2 (rows 0-2), expert 2
// token 2 (row 3), expert 3 tokens 0, 1 (rows 4-5).
TEST(MoeGroupTest, HandComputedOrderAndEmptyExperts) {
  const Grouped g = group(i32_rows({{3, 0}, {0, 3}, {2, 0}}), 5);
  EXPECT_EQ(values(g.offsets), (std::vector<int32_t>{0, 3, 3, 4, 6, 6}));
  EXPECT_EQ(values(g.rows), (std::vector<int32_t>{0, 1, 2, 2, 0, 1}));
  EXPECT_EQ(values(g.slot), (std::vector<int32_t>{4, 0, 1, 5, 3, 2}));
  // The same expert twice in one token (never from moe_route, still well defined): j order.
  const Grouped d = group(i32_rows({{1, 1}}), 2);
  EXPECT_EQ(values(d.offsets), (std::vector<int32_t>{0, 0, 2}));
  EXPECT_EQ(values(d.rows), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(values(d.slot), (std::vector<int32_t>{0, 1}));
  // The offsets' read-back: on the CPU the values at once, as moe_offsets_to_host gives them.
  ops::MoeOffsetsReadback back(g.offsets);
  EXPECT_EQ(back.wait(), (std::vector<int64_t>{0, 3, 3, 4, 6, 6}));
  EXPECT_EQ(ops::moe_offsets_to_host(g.offsets), (std::vector<int64_t>{0, 3, 3, 4, 6, 6}));
  EXPECT_THROW(ops::MoeOffsetsReadback(g.rows.view({2, 3})), Error);  // rank 2
  EXPECT_THROW(ops::MoeOffsetsReadback(Tensor::empty({4}, DType::kFP32)), Error);
  Tensor wide = Tensor::empty({4, 2}, DType::kI32);
  EXPECT_THROW(ops::HostReadback(wide.select(1, 0)), Error);  // strided
}

// Random ids against the defining properties: offsets are the running counts; walking the pairs
// in (t, j) order, each expert's rows are handed out in increasing order; rows and slot agree.
TEST(MoeGroupTest, RandomIdsSatisfyTheContract) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (const auto& [T, K, E] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 3, 11}, {64, 8, 256}, {33, 6, 5}}) {
    Tensor ids = Tensor::empty({T, K}, DType::kI32);
    // Skewed: most pairs go to a few experts, so some experts stay empty.
    for (int64_t i = 0; i < T * K; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(rng() % 2 ? rng() % (E / 4 + 1) : rng() % E);
    const Grouped g = group(ids, E);
    std::vector<int64_t> next(E + 1, 0);
    for (int64_t i = 0; i < T * K; ++i) ++next[ids.data<int32_t>()[i] + 1];
    for (int64_t e = 0; e < E; ++e) next[e + 1] += next[e];
    for (int64_t e = 0; e <= E; ++e) ASSERT_EQ(g.offsets.data<int32_t>()[e], next[e]) << "offsets[" << e << "]";
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids.data<int32_t>()[t * K + j], r = g.slot.data<int32_t>()[t * K + j];
        ASSERT_EQ(r, next[e]++) << "slot[" << t << ", " << j << "]";
        ASSERT_EQ(g.rows.data<int32_t>()[r], t) << "rows[" << r << "]";
      }
  }
}

TEST(MoeGroupTest, BadIdsAndShapesAreErrors) {
  const Tensor ids = i32_rows({{0, 1}, {4, 2}});
  Tensor off = Tensor::empty({5}, DType::kI32), rows = Tensor::empty({4}, DType::kI32), slot = Tensor::empty({2, 2}, DType::kI32);
  try {
    ops::moe_group(ids, 4, off, rows, slot);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids[1, 0]=4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::moe_group(i32_rows({{0, -1}}), 4, off, rows.slice(0, 0, 2), slot.slice(0, 0, 1)), Error);
  EXPECT_THROW(ops::moe_group(ids, 5, off, rows, slot), Error);                      // offsets must be [E + 1]
  EXPECT_THROW(ops::moe_group(ids, 8, Tensor::empty({9}, DType::kI32), rows.slice(0, 0, 3), slot), Error);  // rows [T k]
  EXPECT_THROW(ops::moe_group(ids, 8, Tensor::empty({9}, DType::kFP32), rows, slot), Error);
}

}  // namespace
}  // namespace locus::testing
