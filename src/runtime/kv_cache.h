// KV cache manager: hands out one DeepseekV3Cache (MLA latent cache, every layer) per sequence,
// within a byte budget and a sequence-count limit, and reuses the memory of finished sequences.
//
// A sequence asks for the tokens it may reach (prompt + max new tokens, at most max_seq_len);
// its cache is sized to that rounded up to kBlockTokens (capped at max_seq_len) so caches of
// finished sequences fit later requests. The budget counts every cache allocated, live or kept
// for reuse; kept caches are freed first when a new one would not fit.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/deepseek_v3_cache.h"
#include "models/deepseek_v3_config.h"
#include "runtime/llm_args.h"

namespace locus::runtime {

struct KvBudget {
  int64_t bytes = 0;
  std::string source;  // "kv_cache_budget_bytes=...", or how the fraction was applied
};

// args.kv_cache_budget_bytes when > 0, else kv_cache_memory_fraction of the memory free now on
// `device` (call after the weights are loaded). Error when free memory cannot be determined.
KvBudget resolve_kv_budget(const LlmArgs& args, Device device);

class KvCacheManager {
 public:
  static constexpr int64_t kBlockTokens = 64;

  KvCacheManager(const models::DeepseekV3Config& cfg, Device device, KvBudget budget, int max_sequences,
                 int64_t max_seq_len);

  // A cache for a sequence that may reach `tokens` tokens. Errors name the limit:
  // tokens > max_seq_len, max_batch_size sequences already live, or the budget exceeded
  // (bytes needed, in use, and the budget with its source).
  int64_t acquire(int64_t tokens);
  models::DeepseekV3Cache& cache(int64_t id);  // Error for an unknown or released id
  // Ends the sequence; its cache is cleared and kept for reuse.
  void release(int64_t id);
  // Frees every kept (not live) cache.
  void trim();

  int live_sequences() const { return static_cast<int>(live_.size()); }
  int kept_caches() const { return static_cast<int>(free_.size()); }
  int64_t bytes_allocated() const { return bytes_; }  // live + kept
  int64_t bytes_per_token() const { return bytes_per_token_; }
  const KvBudget& budget() const { return budget_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  // The most tokens one more sequence could get now (after freeing kept caches).
  int64_t max_tokens_available() const;

 private:
  models::DeepseekV3Config cfg_;
  Device device_;
  KvBudget budget_;
  int max_sequences_;
  int64_t max_seq_len_;
  int64_t bytes_per_token_;
  int64_t bytes_ = 0;
  int64_t next_id_ = 1;
  std::map<int64_t, std::unique_ptr<models::DeepseekV3Cache>> live_;
  std::vector<std::unique_ptr<models::DeepseekV3Cache>> free_;
};

}  // namespace locus::runtime
