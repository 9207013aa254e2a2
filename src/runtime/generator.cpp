#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace locus::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Generator::Generator(models::DeepseekV3ForCausalLM& model, KvCacheManager& kv, std::vector<int32_t> eos_ids,
                     DecodeGraphs* graphs, bool lookahead)
    : model_(model), kv_(kv), eos_(std::move(eos_ids)), graphs_(graphs), lookahead_(lookahead) {}

std::vector<GenerationResult> Generator::generate(const std::vector<GenerationRequest>& requests,
                                                  const std::function<void(size_t, int32_t)>& on_token,
                                                  GenerationStats* stats) {
  LOCUS_CHECK(!requests.empty(), "generate: no prompts");
  const size_t n = requests.size();
  for (size_t i = 0; i < n; ++i) {  // before any cache is taken, naming the request
    LOCUS_CHECK(!requests[i].prompt.empty(), "generate: prompt ", i, " has no tokens");
    LOCUS_CHECK(requests[i].max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ",
                requests[i].max_new_tokens, " (prompt ", i, ")");
  }
  BatchStepper stepper(model_, kv_, eos_, graphs_);  // every cache is acquired before any compute
  stepper.set_lookahead(lookahead_);
  for (size_t i = 0; i < n; ++i) {          // request i gets key i
    GenerationRequest r = requests[i];
    r.sampling.seed += i;
    std::function<void(int32_t)> cb;
    if (on_token) cb = [&on_token, i](int32_t id) { on_token(i, id); };
    stepper.add(r, std::move(cb));
  }
  std::vector<GenerationResult> results(n);
  GenerationStats st;
  auto t0 = std::chrono::steady_clock::now();
  for (bool first = true; !stepper.empty(); first = false) {
    BatchStepper::StepInfo info;
    for (auto& f : stepper.step(&info)) results[f.key] = std::move(f.result);
    if (first) {
      st.prompt_tokens = info.prompt_tokens;
      st.prefill_seconds = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    } else {
      ++st.decode_steps;
      st.decode_tokens += info.decode_tokens;
    }
  }
  st.decode_seconds = seconds_since(t0);
  if (stats) *stats = st;
  return results;
}

}  // namespace locus::runtime
