#include "models/deepseek_v3_cache.h"

namespace locus::models {

DeepseekV3Cache DeepseekV3Cache::allocate(const DeepseekV3Config& cfg, int64_t capacity, Device device) {
  LOCUS_CHECK(capacity >= 1, "KV cache capacity must be at least 1 token, got ", capacity);
  DeepseekV3Cache c;
  c.layers.reserve(static_cast<size_t>(cfg.num_hidden_layers));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    c.layers.push_back(modules::MlaKvCache::allocate(capacity, cfg.kv_lora_rank, cfg.qk_rope_head_dim, device));
  return c;
}

int64_t DeepseekV3Cache::bytes_per_token(const DeepseekV3Config& cfg) {
  return cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) *
         static_cast<int64_t>(dtype_size(DType::kBF16));
}

int64_t DeepseekV3Cache::bytes() const {
  int64_t b = 0;
  for (const auto& l : layers) b += l.latent.defined() ? static_cast<int64_t>(l.latent.nbytes()) : 0;
  return b;
}

void DeepseekV3Cache::truncate(int64_t n) {
  LOCUS_CHECK(n >= 0 && n <= length(), "KV cache truncate(", n, ") outside [0, ", length(), "]");
  for (auto& l : layers) l.length = n;
}

}  // namespace locus::models
