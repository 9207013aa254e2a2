#include "runtime/kv_cache.h"

#include <unistd.h>

#include <algorithm>

#if defined(LOCUS_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "core/device_hooks.h"
#include "runtime/progress.h"

namespace locus::runtime {

KvBudget resolve_kv_budget(const LlmArgs& args, Device device) {
  if (args.kv_cache_budget_bytes > 0)
    return {args.kv_cache_budget_bytes, str("kv_cache_budget_bytes=", args.kv_cache_budget_bytes)};
  int64_t free_bytes = -1;
  if (device.is_cpu()) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) free_bytes = static_cast<int64_t>(pages) * page;
  } else {
#if defined(LOCUS_WITH_CUDA)
    release_device_cache(device);  // cached, unused blocks count as free memory
    int prev = 0;
    size_t f = 0, total = 0;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(device.index) == cudaSuccess &&
        cudaMemGetInfo(&f, &total) == cudaSuccess)
      free_bytes = static_cast<int64_t>(f);
    cudaSetDevice(prev);
#endif
  }
  LOCUS_CHECK(free_bytes > 0, "cannot determine the free memory of ", device.name(),
              " for the KV cache: set kv_cache_budget_bytes");
  const auto b = static_cast<int64_t>(static_cast<double>(free_bytes) * args.kv_cache_memory_fraction);
  return {b, str("kv_cache_memory_fraction=", args.kv_cache_memory_fraction, " of ",
                 format_bytes(static_cast<uint64_t>(free_bytes)), " free on ", device.name())};
}

KvCacheManager::KvCacheManager(const models::DeepseekV3Config& cfg, Device device, KvBudget budget, int max_sequences,
                               int64_t max_seq_len)
    : cfg_(cfg),
      device_(device),
      budget_(std::move(budget)),
      max_sequences_(max_sequences),
      max_seq_len_(max_seq_len),
      bytes_per_token_(models::DeepseekV3Cache::bytes_per_token(cfg)) {
  LOCUS_CHECK(max_sequences_ >= 1, "KV cache: max_batch_size must be >= 1, got ", max_sequences_);
  LOCUS_CHECK(max_seq_len_ >= 1, "KV cache: max_seq_len must be >= 1, got ", max_seq_len_);
  LOCUS_CHECK(budget_.bytes >= bytes_per_token_, "KV cache budget ", budget_.bytes, " bytes (", budget_.source,
              ") does not hold a single token (", bytes_per_token_, " bytes per token over ", cfg.num_hidden_layers,
              " layers)");
}

int64_t KvCacheManager::max_tokens_available() const {
  int64_t live_bytes = 0;
  for (const auto& [id, c] : live_) live_bytes += c->bytes();
  return std::min(max_seq_len_, (budget_.bytes - live_bytes) / bytes_per_token_);
}

int64_t KvCacheManager::acquire(int64_t tokens) {
  LOCUS_CHECK(tokens >= 1, "KV cache: a sequence needs at least 1 token, got ", tokens);
  LOCUS_CHECK(tokens <= max_seq_len_, "KV cache: a sequence of ", tokens, " tokens (prompt + max new tokens) exceeds ",
              "max_seq_len=", max_seq_len_);
  LOCUS_CHECK(live_sequences() < max_sequences_, "KV cache: ", live_sequences(),
              " sequences are already running; max_batch_size=", max_sequences_);

  // Reuse the smallest kept cache that fits.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if ((*it)->capacity() >= tokens && (best == free_.end() || (*it)->capacity() < (*best)->capacity())) best = it;
  std::unique_ptr<models::DeepseekV3Cache> c;
  if (best != free_.end()) {
    c = std::move(*best);
    free_.erase(best);
  } else {
    const int64_t cap = std::min(max_seq_len_, (tokens + kBlockTokens - 1) / kBlockTokens * kBlockTokens);
    // Prefer the rounded capacity, fall back to exactly what was asked when only that fits.
    int64_t need = cap * bytes_per_token_;
    const int64_t exact = tokens * bytes_per_token_;
    while (bytes_ + exact > budget_.bytes && !free_.empty()) {  // free kept caches to make room
      bytes_ -= free_.back()->bytes();
      free_.pop_back();
    }
    int64_t capacity = cap;
    if (bytes_ + need > budget_.bytes) {
      capacity = tokens;
      need = exact;
    }
    LOCUS_CHECK(bytes_ + need <= budget_.bytes, "KV cache budget exceeded: a sequence of ", tokens, " tokens needs ",
                format_bytes(static_cast<uint64_t>(need)), " (", bytes_per_token_, " bytes per token), ",
                format_bytes(static_cast<uint64_t>(bytes_)), " are in use by ", live_sequences(),
                " sequences, budget ", format_bytes(static_cast<uint64_t>(budget_.bytes)), " (", budget_.source,
                "); raise kv_cache_budget_bytes or shorten max_new_tokens");
    c = std::make_unique<models::DeepseekV3Cache>(models::DeepseekV3Cache::allocate(cfg_, capacity, device_));
    bytes_ += c->bytes();
  }
  c->clear();
  const int64_t id = next_id_++;
  live_[id] = std::move(c);
  return id;
}

models::DeepseekV3Cache& KvCacheManager::cache(int64_t id) {
  auto it = live_.find(id);
  LOCUS_CHECK(it != live_.end(), "KV cache: no live sequence with id ", id);
  return *it->second;
}

void KvCacheManager::release(int64_t id) {
  auto it = live_.find(id);
  LOCUS_CHECK(it != live_.end(), "KV cache: release of unknown or already released sequence id ", id);
  it->second->clear();
  free_.push_back(std::move(it->second));
  live_.erase(it);
}

void KvCacheManager::trim() {
  for (auto& c : free_) bytes_ -= c->bytes();
  free_.clear();
}

}  // namespace locus::runtime
