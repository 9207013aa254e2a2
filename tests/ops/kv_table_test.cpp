// ops::kv_append_rows and ops::mla_attention_table on the CPU: the table ops are the direct ops
// over views of each cache (bitwise), rows land exactly at each sequence's length and nowhere
// else, and bad tables are refused with errors that name what is wrong.
#include "ops/kv_table.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ops/attention.h"
#include "test_util.h"

namespace locus::testing {
namespace {

constexpr int64_t kDc = 64, kDr = 16, kWidth = kDc + kDr, kHeads = 4;

// Caches of the given lengths (random rows, NaN past them, 3 spare rows) and their table.
struct Caches {
  std::vector<Tensor> latent;
  Tensor rows, lengths;
  ops::KvTable table;
  Caches(const std::vector<int64_t>& lens, uint64_t seed) {
    const int64_t B = static_cast<int64_t>(lens.size());
    rows = Tensor::empty({B}, DType::kI64);
    lengths = Tensor::empty({B}, DType::kI32);
    int64_t most = 0;
    for (int64_t b = 0; b < B; ++b) {
      Tensor c = randn({lens[b] + 3, kWidth}, DType::kBF16, seed + static_cast<uint64_t>(b));
      c.slice(0, lens[b], lens[b] + 3).fill_nan_();
      latent.push_back(c);
      rows.data<int64_t>()[b] = static_cast<int64_t>(reinterpret_cast<intptr_t>(c.data_ptr()));
      lengths.data<int32_t>()[b] = static_cast<int32_t>(lens[b]);
      most = std::max(most, lens[b]);
    }
    table = {rows, lengths, kWidth, most + 1};
  }
};

TEST(KvTable, AppendWritesOneRowAtEachSequencesLength) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Caches c({0, 5, 70}, seed);
  std::vector<Tensor> before;
  for (const Tensor& t : c.latent) before.push_back(t.clone());
  const Tensor src = randn({3, kWidth}, DType::kBF16, seed + 100);
  ops::kv_append_rows(src, c.table);
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t len = c.lengths.data<int32_t>()[b], rows = c.latent[b].size(0);
    EXPECT_TRUE(bitwise_equal(c.latent[b].slice(0, len, len + 1), src.slice(0, b, b + 1))) << "sequence " << b;
    if (len > 0) EXPECT_TRUE(bitwise_equal(c.latent[b].slice(0, 0, len), before[b].slice(0, 0, len)));
    EXPECT_TRUE(bitwise_equal(c.latent[b].slice(0, len + 1, rows), before[b].slice(0, len + 1, rows)));
  }
}

TEST(KvTable, AttentionIsTheBatchOpOverEachCache) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const std::vector<int64_t> lens = {0, 9, 130, 33};
  Caches c(lens, seed);
  const int64_t B = static_cast<int64_t>(lens.size());
  // The new tokens' rows are in the caches (appended), as MLA::forward_table does before attending.
  ops::kv_append_rows(randn({B, kWidth}, DType::kBF16, seed + 50), c.table);
  const Tensor q_lat = randn({B, kHeads, kDc}, DType::kBF16, seed + 51);
  const Tensor q_pe = randn({B, kHeads, kDr}, DType::kBF16, seed + 52);
  const float scale = 0.125f;
  Tensor got = Tensor::empty({B, kHeads, kDc}, DType::kBF16);
  got.fill_nan_();
  ops::mla_attention_table(q_lat, q_pe, c.table, got, scale);
  std::vector<ops::AttentionKeys> keys;
  for (int64_t b = 0; b < B; ++b) {
    const Tensor rows = c.latent[b].slice(0, 0, lens[b] + 1);
    const Tensor kv = rows.slice(1, 0, kDc).unsqueeze(1);
    keys.push_back({kv, rows.slice(1, kDc, kWidth).unsqueeze(1), kv});
  }
  Tensor want = Tensor::empty({B, kHeads, kDc}, DType::kBF16);
  want.fill_nan_();
  ops::mla_attention_batch(q_lat, q_pe, keys, want, scale);
  EXPECT_TRUE(bitwise_equal(got, want));
}

TEST(KvTable, BadTablesAreRefusedByName) {
  Caches c({4, 7}, fresh_seed());
  const Tensor src = randn({2, kWidth}, DType::kBF16, 1);
  auto expect_error = [](const std::function<void()>& f, const std::string& part) {
    try {
      f();
      FAIL() << "no error, expected one naming " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  ops::KvTable narrow = c.table;
  narrow.width = kWidth - 1;
  expect_error([&] { ops::kv_append_rows(src, narrow); }, "table width");
  ops::KvTable short_bound = c.table;
  short_bound.max_keys = 5;  // sequence 1 holds 7
  expect_error([&] { ops::kv_append_rows(src, short_bound); }, "bound of 5 keys");
  ops::KvTable wrong_type = c.table;
  wrong_type.rows = Tensor::empty({2}, DType::kI32);
  expect_error([&] { ops::kv_append_rows(src, wrong_type); }, "table.rows");
  expect_error([&] { ops::kv_append_rows(randn({3, kWidth}, DType::kBF16, 2), c.table); }, "sequences");
  const Tensor q_lat = randn({2, kHeads, kDc}, DType::kBF16, 3), q_pe = randn({2, kHeads, kDr + 1}, DType::kBF16, 4);
  Tensor out = Tensor::empty({2, kHeads, kDc}, DType::kBF16);
  expect_error([&] { ops::mla_attention_table(q_lat, q_pe, c.table, out, 1.f); }, "q_b");
}

}  // namespace
}  // namespace locus::testing
