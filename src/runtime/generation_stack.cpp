#include "runtime/generation_stack.h"

#include "core/error.h"

namespace locus::runtime {

std::unique_ptr<GenerationStack> GenerationStack::load(const LlmArgs& args, const ModelLoaderOptions& options,
                                                       const char* command) {
  LOCUS_CHECK(!args.model.empty(), command, ": --model DIR is required");
  auto s = std::unique_ptr<GenerationStack>(new GenerationStack{
      args, Tokenizer::from_path(args.tokenizer.empty() ? args.model : args.tokenizer), {}, {}, nullptr, nullptr, nullptr});
  s->model = ModelLoader(args, options).load();
  LOCUS_CHECK(s->tokenizer.vocab_size() <= s->model.config.vocab_size, "tokenizer has ", s->tokenizer.vocab_size(),
              " tokens but the model's vocab_size is ", s->model.config.vocab_size);
  for (int64_t e : s->model.config.eos_token_ids) s->eos_ids.push_back(static_cast<int32_t>(e));
  if (auto e = s->tokenizer.eos_id()) s->eos_ids.push_back(*e);
  s->kv = std::make_unique<KvCacheManager>(s->model.config, s->model.device, resolve_kv_budget(args, s->model.device),
                                           args.max_batch_size, args.max_seq_len);
  if (args.cuda_graphs) s->graphs = std::make_unique<DecodeGraphs>(*s->model.model);
  s->generator =
      std::make_unique<Generator>(*s->model.model, *s->kv, s->eos_ids, s->graphs.get(), args.decode_lookahead);
  return s;
}

}  // namespace locus::runtime
