// Generation loop over a batch of sequences: one prefill forward for every prompt together, then
// one decode forward per step for the sequences still running (each with its own KV cache and
// its own seeded sampler), until each emits an end-of-sequence token or reaches its token limit.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/deepseek_v3.h"
#include "runtime/batch_stepper.h"
#include "runtime/kv_cache.h"

namespace locus::runtime {

struct GenerationStats {
  int64_t prompt_tokens = 0, decode_tokens = 0;  // decode: tokens produced by decode steps
  int64_t decode_steps = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0; }
};

class Generator {
 public:
  // eos_ids: tokens that end a sequence (config eos_token_id and the tokenizer's eos).
  // graphs: optional (BatchStepper), outliving the generator; lookahead: BatchStepper::set_lookahead.
  Generator(models::DeepseekV3ForCausalLM& model, KvCacheManager& kv, std::vector<int32_t> eos_ids,
            DecodeGraphs* graphs = nullptr, bool lookahead = false);

  // Sequence i samples with seed sampling.seed + i. on_token(i, id) is called for every token
  // sequence i generates, as soon as it is sampled.
  // Every request's KV cache is acquired up front (budget errors before any compute) and
  // released at the end, also on error.
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const std::function<void(size_t, int32_t)>& on_token = {},
                                         GenerationStats* stats = nullptr);

 private:
  models::DeepseekV3ForCausalLM& model_;
  KvCacheManager& kv_;
  std::vector<int32_t> eos_;
  DecodeGraphs* graphs_;
  bool lookahead_;
};

}  // namespace locus::runtime
