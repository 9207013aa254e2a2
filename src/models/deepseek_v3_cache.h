// The KV cache of one sequence for the whole DeepSeek-V3 model: one MLA latent cache per layer
// (per token: the normalized c_kv and the rotated k_pe, kv_lora_rank + qk_rope_head_dim values).
// Every layer holds the same number of tokens between forward calls.
#pragma once
#include <cstdint>
#include <vector>

#include "models/deepseek_v3_config.h"
#include "modules/mla.h"

namespace locus::models {

struct DeepseekV3Cache {
  std::vector<modules::MlaKvCache> layers;

  // Room for `capacity` tokens in every layer (bf16, on `device`).
  static DeepseekV3Cache allocate(const DeepseekV3Config& cfg, int64_t capacity, Device device = Device::cpu());
  // Bytes one cached token takes over all layers: layers * (kv_lora_rank + qk_rope_head_dim) * 2.
  static int64_t bytes_per_token(const DeepseekV3Config& cfg);

  int64_t length() const { return layers.empty() ? 0 : layers[0].length; }
  int64_t capacity() const { return layers.empty() ? 0 : layers[0].capacity(); }
  int64_t bytes() const;
  // Forgets the cached tokens (keeps the memory, for reuse by the next sequence).
  void clear() { truncate(0); }
  // Keeps the first n tokens of every layer (n <= length()).
  void truncate(int64_t n);
};

}  // namespace locus::models
