#include "runtime/kv_cache.h"

#include <gtest/gtest.h>

#include "runtime/runtime_test_util.h"

namespace locus::testing {
namespace {

models::DeepseekV3Config small_config() {
  models::DeepseekV3Config c;
  c.num_hidden_layers = 3;
  c.kv_lora_rank = 16;
  c.qk_rope_head_dim = 8;
  return c;
}

TEST(KvCache, BytesPerTokenIsTheLatentRowOverAllLayers) {
  auto c = small_config();
  EXPECT_EQ(models::DeepseekV3Cache::bytes_per_token(c), 3 * (16 + 8) * 2);
  models::DeepseekV3Config v3;  // DeepSeek-V3 defaults: 61 layers x 576 values x 2 bytes
  EXPECT_EQ(models::DeepseekV3Cache::bytes_per_token(v3), 61 * 576 * 2);
  auto cache = models::DeepseekV3Cache::allocate(c, 10);
  EXPECT_EQ(cache.layers.size(), 3u);
  EXPECT_EQ(cache.capacity(), 10);
  EXPECT_EQ(cache.bytes(), 10 * models::DeepseekV3Cache::bytes_per_token(c));
}

TEST(KvCache, AcquireRoundsToBlocksAndReusesReleasedCaches) {
  auto c = small_config();
  const int64_t bpt = models::DeepseekV3Cache::bytes_per_token(c);
  runtime::KvCacheManager kv(c, Device::cpu(), {1000 * bpt, "test budget"}, 4, 512);
  const int64_t a = kv.acquire(10);
  EXPECT_EQ(kv.cache(a).capacity(), runtime::KvCacheManager::kBlockTokens);
  EXPECT_EQ(kv.bytes_allocated(), 64 * bpt);
  kv.cache(a).layers[0].length = 7;  // as if tokens were appended
  for (auto& l : kv.cache(a).layers) l.length = 7;
  const void* mem = kv.cache(a).layers[0].latent.data_ptr();
  kv.release(a);
  EXPECT_EQ(kv.live_sequences(), 0);
  EXPECT_EQ(kv.kept_caches(), 1);
  const int64_t b = kv.acquire(30);  // fits the kept cache: same memory, cleared
  EXPECT_EQ(kv.cache(b).layers[0].latent.data_ptr(), mem);
  EXPECT_EQ(kv.cache(b).length(), 0);
  EXPECT_EQ(kv.bytes_allocated(), 64 * bpt);
  expect_error([&] { kv.cache(a); }, {"no live sequence", std::to_string(a)});
  expect_error([&] { kv.release(a); }, {"already released"});
  kv.release(b);
  kv.trim();
  EXPECT_EQ(kv.bytes_allocated(), 0);
}

TEST(KvCache, LimitsAreErrorsNamingTheOption) {
  auto c = small_config();
  const int64_t bpt = models::DeepseekV3Cache::bytes_per_token(c);
  runtime::KvCacheManager kv(c, Device::cpu(), {100 * bpt, "kv_cache_budget_bytes=" + std::to_string(100 * bpt)}, 2,
                             80);
  expect_error([&] { kv.acquire(81); }, {"max_seq_len=80"});
  const int64_t a = kv.acquire(64);
  // 64 in use; 40 more do not fit the 100-token budget (rounded or exact).
  expect_error([&] { kv.acquire(40); }, {"budget exceeded", "kv_cache_budget_bytes"});
  const int64_t b = kv.acquire(36);  // exactly fits: 64 + 36 = 100 tokens
  EXPECT_EQ(kv.cache(b).capacity(), 36);
  expect_error([&] { kv.acquire(1); }, {"max_batch_size=2"});
  kv.release(a);
  kv.release(b);
  // Kept caches are freed to make room for a larger request.
  const int64_t d = kv.acquire(80);
  EXPECT_EQ(kv.cache(d).capacity(), 80);
  EXPECT_LE(kv.bytes_allocated(), 100 * bpt);
  expect_error([] { runtime::KvCacheManager(small_config(), Device::cpu(), {10, "tiny"}, 1, 8); },
               {"does not hold a single token"});
}

TEST(KvCache, BudgetResolution) {
  runtime::LlmArgs a;
  a.kv_cache_budget_bytes = 12345;
  auto b = runtime::resolve_kv_budget(a, Device::cpu());
  EXPECT_EQ(b.bytes, 12345);
  EXPECT_NE(b.source.find("kv_cache_budget_bytes"), std::string::npos);
  a.kv_cache_budget_bytes = 0;
  a.kv_cache_memory_fraction = 0.5;
  b = runtime::resolve_kv_budget(a, Device::cpu());
  EXPECT_GT(b.bytes, 0);
  EXPECT_NE(b.source.find("kv_cache_memory_fraction"), std::string::npos);
}

}  // namespace
}  // namespace locus::testing
