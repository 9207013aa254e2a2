// `locus generate --model DIR --prompt TEXT [--prompt TEXT ...] [--max-new-tokens N]
//   [--temperature T --top-k K --top-p P] [--seed S] [--warmup] [every LlmArgs flag]`:
// tokenizes the prompts, runs them as one batch (prefill, then decode until eos or N tokens;
// with --ignore-eos, N tokens), streams the text of a single prompt to stdout as it is generated
// (several prompts: each completion is printed when done) and prints prompt / decode tokens per
// second to stderr. --warmup first runs the batch untimed for two new tokens (with cuda_graphs,
// for all of them: every decode graph is then recorded), so that one-time work (CUDA: cuBLASLt
// tactics and path choices timed per shape, memory pools growing) stays out of the figures.
#include <cstdio>
#include <iostream>
#include <memory>

#include "core/host_profile.h"
#include "runtime/generation_stack.h"
#include "runtime/llm_args_cli.h"
#include "serve/cli/command.h"

namespace {

struct GenerateOptions {
  std::vector<std::string> prompts;
  int64_t max_new_tokens = 32;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  bool no_bos = false;
  bool ignore_eos = false;
  bool quiet = false;
  bool warmup = false;
};

int run_generate(const locus::runtime::LlmArgsCli& cli, const GenerateOptions& o) {
  using namespace locus;
  using namespace locus::runtime;
  LlmArgs args = cli.resolve();
  LOCUS_CHECK(static_cast<int64_t>(o.prompts.size()) <= args.max_batch_size, "generate: ", o.prompts.size(),
              " prompts exceed max_batch_size=", args.max_batch_size);
  SamplingParams sp{o.temperature, o.top_k, o.top_p, args.seed};
  sp.validate();

  ModelLoaderOptions lo;
  lo.progress = !o.quiet;
  lo.log = o.quiet ? nullptr : stderr;
  auto stack = GenerationStack::load(args, lo, "generate");
  const Tokenizer& tok = stack->tokenizer;

  std::vector<GenerationRequest> reqs;
  for (const auto& p : o.prompts) {
    GenerationRequest r;
    r.prompt = tok.encode(p, !o.no_bos && tok.bos_id().has_value());
    LOCUS_CHECK(!r.prompt.empty(), "generate: prompt \"", p, "\" encodes to no tokens");
    r.max_new_tokens = o.max_new_tokens;
    r.sampling = sp;
    r.ignore_eos = o.ignore_eos;
    reqs.push_back(r);
  }
  Generator& gen = *stack->generator;
  if (o.warmup) {
    std::vector<GenerationRequest> warm = reqs;
    for (auto& r : warm) {
      // The prompts' prefill and one decode step at the same batch size; with decode graphs the
      // whole run, so that every graph it needs (one per key bound) is recorded untimed.
      if (!stack->graphs) r.max_new_tokens = 2;
      r.ignore_eos = true;
    }
    gen.generate(warm);
  }
  const bool stream = reqs.size() == 1;
  StreamingDecoder dec(tok);
  if (stream) {
    std::cout << o.prompts[0] << std::flush;
  }
  GenerationStats st;
  bool prefill_done = false;
  auto results = gen.generate(
      reqs,
      [&](size_t, int32_t id) {
        if (!prefill_done) HostProfile::reset();  // the report covers the decode steps only
        prefill_done = true;
        if (stream) std::cout << dec.push(id) << std::flush;
      },
      &st);
  if (stream) {
    std::cout << dec.flush() << "\n";
  } else {
    for (size_t i = 0; i < results.size(); ++i)
      std::cout << "[" << i << "] " << o.prompts[i] << tok.decode(results[i].tokens, true) << "\n";
  }
  std::cout << std::flush;  // the text before the stats line on stderr
  std::string reasons;
  for (size_t i = 0; i < results.size(); ++i) reasons += (i ? "," : "") + results[i].finish_reason;
  std::fprintf(stderr,
               "locus: %zu sequence%s, sampling %s; prompt %lld tokens in %.3f s (%.1f tok/s); "
               "decode %lld tokens in %.3f s (%.1f tok/s); finished: %s\n",
               results.size(), results.size() == 1 ? "" : "s", sp.describe().c_str(),
               static_cast<long long>(st.prompt_tokens), st.prefill_seconds, st.prefill_tokens_per_second(),
               static_cast<long long>(st.decode_tokens), st.decode_seconds, st.decode_tokens_per_second(),
               reasons.c_str());
  if (stack->graphs) {
    const DecodeGraphs::Stats& g = stack->graphs->stats();
    std::fprintf(stderr, "locus: decode graphs: %lld recorded, %lld steps replayed (%lld chained on the device), %lld eager "
                 "(first of a key), %lld declined, %lld evicted%s%s\n",
                 static_cast<long long>(g.recorded), static_cast<long long>(g.replays),
                 static_cast<long long>(g.chained), static_cast<long long>(g.eager_steps), static_cast<long long>(g.declined),
                 static_cast<long long>(g.evicted),
                 g.capture_failure.empty() ? "" : "; a capture failed: ", g.capture_failure.c_str());
  }
  if (HostProfile::enabled()) std::fprintf(stderr, "%s", HostProfile::report().c_str());
  return 0;
}

}  // namespace

LOCUS_REGISTER_COMMAND("generate", "generate text from one or more prompts (a batch) with a DeepSeek-V3 model",
                       [](CLI::App& app) {
                         auto cli = std::make_shared<locus::runtime::LlmArgsCli>(app);
                         auto o = std::make_shared<GenerateOptions>();
                         app.add_option("--prompt", o->prompts, "prompt text; repeat for a batch")->required();
                         app.add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate per prompt")
                             ->capture_default_str();
                         app.add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
                         app.add_option("--top-k", o->top_k, "0 = no limit")->capture_default_str();
                         app.add_option("--top-p", o->top_p, "nucleus mass in (0, 1]")->capture_default_str();
                         app.add_flag("--no-bos", o->no_bos, "do not prepend the tokenizer's bos token");
                         app.add_flag("--ignore-eos", o->ignore_eos,
                                      "generate --max-new-tokens tokens per prompt even past an end-of-sequence "
                                      "token (for timing)");
                         app.add_flag("--quiet", o->quiet, "no progress bar or load notes");
                         app.add_flag("--warmup", o->warmup,
                                      "first run the prompts untimed for 2 new tokens (one-time tuning and "
                                      "allocations out of the timings)");
                         return [=] { return run_generate(*cli, *o); };
                       });
