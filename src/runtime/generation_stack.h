// Everything text generation needs, loaded from one LlmArgs: the tokenizer, the model, the KV
// cache manager and the Generator, with the end-of-sequence ids of the config and the tokenizer.
// What `locus generate` and `locus serve` start from.
#pragma once
#include <memory>
#include <vector>

#include "runtime/decode_graphs.h"
#include "runtime/generator.h"
#include "runtime/kv_cache.h"
#include "runtime/llm_args.h"
#include "runtime/model_loader.h"
#include "runtime/tokenizer.h"

namespace locus::runtime {

struct GenerationStack {
  LlmArgs args;
  Tokenizer tokenizer;
  LoadedModel model;
  std::vector<int32_t> eos_ids;
  std::unique_ptr<KvCacheManager> kv;
  std::unique_ptr<DecodeGraphs> graphs;  // set when args.cuda_graphs
  std::unique_ptr<Generator> generator;

  // Errors name what is missing or inconsistent (no model directory, a tokenizer larger than the
  // model's vocabulary, ...). `command` prefixes the messages ("generate", "serve").
  static std::unique_ptr<GenerationStack> load(const LlmArgs& args, const ModelLoaderOptions& options,
                                               const char* command);
};

}  // namespace locus::runtime
