#include "runtime/generator.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace locus::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Releases the acquired caches on every exit path.
struct CacheLease {
  KvCacheManager& kv;
  std::vector<int64_t> ids;
  ~CacheLease() {
    for (int64_t id : ids) kv.release(id);
  }
};

}  // namespace

Generator::Generator(models::DeepseekV3ForCausalLM& model, KvCacheManager& kv, std::vector<int32_t> eos_ids)
    : model_(model), kv_(kv), eos_(std::move(eos_ids)) {}

std::vector<GenerationResult> Generator::generate(const std::vector<GenerationRequest>& requests,
                                                  const std::function<void(size_t, int32_t)>& on_token,
                                                  GenerationStats* stats) {
  LOCUS_CHECK(!requests.empty(), "generate: no prompts");
  const size_t n = requests.size();
  std::vector<std::unique_ptr<Sampler>> samplers;
  for (size_t i = 0; i < n; ++i) {
    const auto& r = requests[i];
    LOCUS_CHECK(!r.prompt.empty(), "generate: prompt ", i, " has no tokens");
    LOCUS_CHECK(r.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", r.max_new_tokens);
    SamplingParams p = r.sampling;
    p.seed += i;
    samplers.push_back(std::make_unique<Sampler>(p));
  }
  CacheLease lease{kv_, {}};
  for (size_t i = 0; i < n; ++i)
    lease.ids.push_back(kv_.acquire(static_cast<int64_t>(requests[i].prompt.size()) + requests[i].max_new_tokens));

  std::vector<GenerationResult> results(n);
  GenerationStats st;
  auto is_eos = [&](int32_t t) { return std::find(eos_.begin(), eos_.end(), t) != eos_.end(); };
  std::vector<bool> done(n, false);
  std::vector<int32_t> last(n);
  auto take = [&](size_t i, const float* logits, int64_t vocab) {
    const int32_t t = samplers[i]->sample(logits, vocab);
    results[i].tokens.push_back(t);
    last[i] = t;
    if (on_token) on_token(i, t);
    if (is_eos(t)) {
      done[i] = true;
      results[i].finish_reason = "eos";
    } else if (static_cast<int64_t>(results[i].tokens.size()) >= requests[i].max_new_tokens) {
      done[i] = true;
      results[i].finish_reason = "length";
    }
  };

  const int64_t vocab = model_.config().vocab_size;
  auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<models::SequenceStep> batch;
    for (size_t i = 0; i < n; ++i) {
      batch.push_back({requests[i].prompt, &kv_.cache(lease.ids[i])});
      st.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
    }
    Tensor logits = model_.forward(batch);
    st.prefill_seconds = seconds_since(t0);
    for (size_t i = 0; i < n; ++i) take(i, logits.data<float>() + static_cast<int64_t>(i) * vocab, vocab);
  }
  t0 = std::chrono::steady_clock::now();
  while (true) {
    std::vector<models::SequenceStep> batch;
    std::vector<size_t> which;
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      batch.push_back({{last[i]}, &kv_.cache(lease.ids[i])});
      which.push_back(i);
    }
    if (batch.empty()) break;
    Tensor logits = model_.forward(batch);
    ++st.decode_steps;
    for (size_t j = 0; j < which.size(); ++j) {
      take(which[j], logits.data<float>() + static_cast<int64_t>(j) * vocab, vocab);
      ++st.decode_tokens;
    }
  }
  st.decode_seconds = seconds_since(t0);
  if (stats) *stats = st;
  return results;
}

}  // namespace locus::runtime
