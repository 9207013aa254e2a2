#include "runtime/batch_stepper.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "core/host_profile.h"
#include "ops/host_readback.h"

namespace locus::runtime {

struct BatchStepper::Sequence {
  uint64_t key;
  int64_t cache_id;
  int64_t max_new_tokens;
  bool ignore_eos;
  Sampler sampler;
  std::function<void(int32_t)> on_token;
  std::vector<int32_t> next;  // the tokens of its next step: the prompt, then the last sampled one
  bool prefilled = false;
  GenerationResult result;
};

BatchStepper::BatchStepper(models::DeepseekV3ForCausalLM& model, KvCacheManager& kv, std::vector<int32_t> eos_ids,
                           DecodeGraphs* graphs)
    : model_(model), kv_(kv), eos_(std::move(eos_ids)), graphs_(graphs) {}

BatchStepper::~BatchStepper() {
  for (auto& s : seqs_) kv_.release(s->cache_id);
}

uint64_t BatchStepper::add(const GenerationRequest& r, std::function<void(int32_t)> on_token) {
  LOCUS_CHECK(!r.prompt.empty(), "generate: a prompt has no tokens");
  LOCUS_CHECK(r.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1, got ", r.max_new_tokens);
  Sampler sampler(r.sampling);  // validates the parameters before the cache is taken
  const int64_t id = kv_.acquire(static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens);
  seqs_.push_back(std::unique_ptr<Sequence>(new Sequence{next_key_, id, r.max_new_tokens, r.ignore_eos,
                                                         std::move(sampler), std::move(on_token), r.prompt, false, {}}));
  return next_key_++;
}

GenerationResult BatchStepper::drop(uint64_t key) {
  auto it = std::find_if(seqs_.begin(), seqs_.end(), [&](const auto& s) { return s->key == key; });
  LOCUS_CHECK(it != seqs_.end(), "BatchStepper: no sequence with key ", key);
  kv_.release((*it)->cache_id);
  GenerationResult r = std::move((*it)->result);
  r.finish_reason = "cancelled";
  seqs_.erase(it);
  return r;
}

std::vector<BatchStepper::Finished> BatchStepper::step(StepInfo* info) {
  LOCUS_CHECK(!seqs_.empty(), "BatchStepper: no sequence to step");
  std::vector<models::SequenceStep> batch;
  StepInfo st;
  for (auto& s : seqs_) {
    batch.push_back({s->next, &kv_.cache(s->cache_id)});
    (s->prefilled ? st.decode_tokens : st.prompt_tokens) += static_cast<int64_t>(s->next.size());
  }
  // A step whose sequences all decode greedily finds the tokens where the logits lie and brings
  // back one index per sequence; otherwise the samplers read the whole logits on the host.
  const bool greedy = std::all_of(seqs_.begin(), seqs_.end(), [](const auto& s) { return s->sampler.params().greedy(); });
  Tensor logits;
  {
    HostProfileScope profile(st.prompt_tokens > 0 ? "step (with prompts)" : "step (decode)");
    // On failure the caches are as before: nothing changed.
    if (graphs_ && st.prompt_tokens == 0) logits = graphs_->step(batch);
    if (!logits.defined()) logits = model_.forward_on_device(batch);
  }
  const int64_t vocab = model_.config().vocab_size;
  try {
    std::vector<int32_t> greedy_tokens;
    std::optional<ops::HostReadback> logits_back;  // holds the host copy of the logits
    {
      HostProfileScope profile("sampling (logits or greedy tokens to the host)");
      if (greedy) {
        greedy_tokens = argmax_rows(logits);
      } else {
        logits_back.emplace(logits);
        logits = logits_back->wait();
      }
    }
    for (size_t i = 0; i < seqs_.size(); ++i) {
      Sequence& s = *seqs_[i];
      const int32_t t = greedy ? greedy_tokens[i]
                               : s.sampler.sample(logits.data<float>() + static_cast<int64_t>(i) * vocab, vocab);
      s.result.tokens.push_back(t);
      s.next = {t};
      s.prefilled = true;
      if (s.on_token) s.on_token(t);
      if (!s.ignore_eos && std::find(eos_.begin(), eos_.end(), t) != eos_.end()) s.result.finish_reason = "eos";
      else if (static_cast<int64_t>(s.result.tokens.size()) >= s.max_new_tokens) s.result.finish_reason = "length";
    }
  } catch (...) {
    // A sampler or a callback failed after the caches moved on: no sequence can continue.
    for (auto& s : seqs_) kv_.release(s->cache_id);
    seqs_.clear();
    throw;
  }
  std::vector<Finished> finished;
  std::vector<std::unique_ptr<Sequence>> running;
  for (auto& s : seqs_) {
    if (s->result.finish_reason.empty()) {
      running.push_back(std::move(s));
    } else {
      kv_.release(s->cache_id);
      finished.push_back({s->key, std::move(s->result)});
    }
  }
  seqs_ = std::move(running);
  if (info) *info = st;
  return finished;
}

}  // namespace locus::runtime
