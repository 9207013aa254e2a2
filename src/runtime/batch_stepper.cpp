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

// A step queued on the device: its sequences (by key, in batch order) and where its tokens come
// from; caches of sequences that ended while it was in flight, to release once it is done.
struct BatchStepper::Launched {
  std::vector<uint64_t> keys;
  int64_t prompt_tokens = 0;
  bool greedy = false;
  Tensor logits;                                       // where the tokens are not on their way yet
  std::optional<DecodeGraphs::GreedyTokens> tokens;    // greedy steps run by the graphs
  std::vector<int64_t> release_after;
};

BatchStepper::BatchStepper(models::DeepseekV3ForCausalLM& model, KvCacheManager& kv, std::vector<int32_t> eos_ids,
                           DecodeGraphs* graphs)
    : model_(model), kv_(kv), eos_(std::move(eos_ids)), graphs_(graphs) {}

BatchStepper::~BatchStepper() {
  finish_step(lookahead_);
  for (auto& s : seqs_) kv_.release(s->cache_id);
}

BatchStepper::SequenceList::iterator BatchStepper::find(uint64_t key) {
  return std::find_if(seqs_.begin(), seqs_.end(), [&](const auto& s) { return s->key == key; });
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

void BatchStepper::release_when_done(int64_t cache_id) {
  if (lookahead_) lookahead_->release_after.push_back(cache_id);
  else kv_.release(cache_id);
}

void BatchStepper::finish_step(std::unique_ptr<Launched>& step) {
  if (!step) return;
  std::vector<int64_t> caches = std::move(step->release_after);
  step.reset();  // waits for its tokens' copy, so for the step itself
  for (int64_t c : caches) kv_.release(c);
}

GenerationResult BatchStepper::drop(uint64_t key) {
  auto it = find(key);
  LOCUS_CHECK(it != seqs_.end(), "BatchStepper: no sequence with key ", key);
  release_when_done((*it)->cache_id);  // a lookahead step may still write it
  GenerationResult r = std::move((*it)->result);
  r.finish_reason = "cancelled";
  seqs_.erase(it);
  if (seqs_.empty()) finish_step(lookahead_);  // it ran for ended sequences only: free their caches now
  return r;
}

std::unique_ptr<BatchStepper::Launched> BatchStepper::launch() {
  auto step = std::make_unique<Launched>();
  std::vector<models::SequenceStep> batch;
  for (auto& s : seqs_) {
    batch.push_back({s->next, &kv_.cache(s->cache_id)});
    if (!s->prefilled) step->prompt_tokens += static_cast<int64_t>(s->next.size());
    step->keys.push_back(s->key);
  }
  // A step whose sequences all decode greedily finds the tokens where the logits lie and brings
  // back one index per sequence; otherwise the samplers read the whole logits on the host.
  step->greedy = std::all_of(seqs_.begin(), seqs_.end(), [](const auto& s) { return s->sampler.params().greedy(); });
  HostProfileScope profile(step->prompt_tokens > 0 ? "step (with prompts)" : "step (decode)");
  // On failure the caches are as before: nothing changed.
  if (graphs_ && step->prompt_tokens == 0) step->logits = graphs_->step(batch);
  if (step->logits.defined() && step->greedy) {
    step->tokens.emplace(graphs_->greedy_tokens(step->logits));  // into the tables: a next step may chain
    step->logits = Tensor();
  } else if (!step->logits.defined()) {
    step->logits = model_.forward_on_device(batch);
  }
  return step;
}

std::unique_ptr<BatchStepper::Launched> BatchStepper::launch_chained(const Launched& now) {
  // The same sequences, all greedy, none ending by length with now's token or the next one.
  if (!now.tokens || now.prompt_tokens > 0 || seqs_.size() != now.keys.size()) return nullptr;
  std::vector<models::SequenceStep> batch;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const Sequence& s = *seqs_[i];
    if (s.key != now.keys[i] || static_cast<int64_t>(s.result.tokens.size()) + 2 > s.max_new_tokens) return nullptr;
    batch.push_back({{0}, &kv_.cache(s.cache_id)});  // ids: now's tokens, already on the device
  }
  HostProfileScope profile("step (decode, chained)");
  Tensor logits = graphs_->step_chained(batch);
  if (!logits.defined()) return nullptr;
  auto step = std::make_unique<Launched>();
  step->keys = now.keys;
  step->greedy = true;
  step->tokens.emplace(graphs_->greedy_tokens(logits));
  return step;
}

std::vector<int32_t> BatchStepper::collect(Launched& step) {
  HostProfileScope profile("sampling (logits or greedy tokens to the host)");
  if (step.tokens) return step.tokens->wait();
  if (step.greedy) return argmax_rows(step.logits);
  ops::HostReadback back(step.logits);
  const Tensor logits = back.wait();
  const int64_t vocab = model_.config().vocab_size;
  std::vector<int32_t> out;
  for (size_t i = 0; i < step.keys.size(); ++i) {
    auto it = find(step.keys[i]);  // a sampled step has no lookahead: its sequences are all here
    out.push_back((*it)->sampler.sample(logits.data<float>() + static_cast<int64_t>(i) * vocab, vocab));
  }
  return out;
}

std::vector<BatchStepper::Finished> BatchStepper::step(StepInfo* info) {
  LOCUS_CHECK(!seqs_.empty(), "BatchStepper: no sequence to step");
  // The step launched by the last call, or a new one (its failure leaves the caches as before).
  std::unique_ptr<Launched> now = lookahead_ ? std::move(lookahead_) : launch();
  StepInfo st{now->prompt_tokens, 0};
  std::vector<Finished> finished;
  try {
    // Before waiting for this step's tokens, the next one from the device (lookahead).
    if (lookahead_enabled_ && graphs_) lookahead_ = launch_chained(*now);
    const std::vector<int32_t> tokens = collect(*now);
    for (int64_t c : now->release_after) kv_.release(c);
    now->release_after.clear();
    for (size_t i = 0; i < now->keys.size(); ++i) {
      auto it = find(now->keys[i]);
      if (it == seqs_.end()) continue;  // dropped, or ended, since the step was launched
      Sequence& s = **it;
      const int32_t t = tokens[i];
      if (s.prefilled) ++st.decode_tokens;
      s.result.tokens.push_back(t);
      s.next = {t};
      s.prefilled = true;
      if (s.on_token) s.on_token(t);
      if (!s.ignore_eos && std::find(eos_.begin(), eos_.end(), t) != eos_.end()) s.result.finish_reason = "eos";
      else if (static_cast<int64_t>(s.result.tokens.size()) >= s.max_new_tokens) s.result.finish_reason = "length";
    }
  } catch (...) {
    // A sampler, a callback or a lookahead failed after the caches moved on: no sequence can
    // continue. The steps in flight are waited for before their caches go back.
    finish_step(lookahead_);
    finish_step(now);
    for (auto& s : seqs_) kv_.release(s->cache_id);
    seqs_.clear();
    throw;
  }
  SequenceList running;
  for (auto& s : seqs_) {
    if (s->result.finish_reason.empty()) {
      running.push_back(std::move(s));
    } else {
      release_when_done(s->cache_id);  // the lookahead step, if any, wrote one more row there
      finished.push_back({s->key, std::move(s->result)});
    }
  }
  seqs_ = std::move(running);
  if (seqs_.empty()) finish_step(lookahead_);  // it ran for ended sequences only: free their caches now
  if (info) *info = st;
  return finished;
}

}  // namespace locus::runtime
