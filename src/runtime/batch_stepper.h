// Continuous batching at the level of one forward pass: sequences join (their first step is
// their prefill) and leave (eos or their token limit) between steps, each with its own KV cache
// and its own seeded sampler. Generator runs a fixed set of requests to the end with it; the
// server's engine adds requests as they arrive.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "models/deepseek_v3.h"
#include "runtime/decode_graphs.h"
#include "runtime/kv_cache.h"
#include "runtime/sampler.h"

namespace locus::runtime {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids (at least one)
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;  // run to max_new_tokens whatever it samples (benchmarks: a fixed token count)
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (the eos token included when one ended it)
  std::string finish_reason;    // "eos" or "length" ("cancelled": BatchStepper::drop)
};

class BatchStepper {
 public:
  struct StepInfo {
    int64_t prompt_tokens = 0;  // prefill tokens in the step (sequences added since the last one)
    int64_t decode_tokens = 0;  // sequences that took one decode token
  };

  // eos_ids: tokens that end a sequence. graphs (optional, outliving the stepper): decode steps
  // run through it (runtime/decode_graphs.h); steps it declines run eagerly.
  BatchStepper(models::DeepseekV3ForCausalLM& model, KvCacheManager& kv, std::vector<int32_t> eos_ids,
               DecodeGraphs* graphs = nullptr);
  ~BatchStepper();  // releases the caches of the sequences still running
  BatchStepper(const BatchStepper&) = delete;
  BatchStepper& operator=(const BatchStepper&) = delete;

  // Adds a sequence and returns its key (0, 1, 2, ... in the order of the adds that succeed).
  // Its KV cache is acquired now: an Error (the prompt empty, max_new_tokens < 1, the KV cache
  // full or too small, bad sampling parameters) adds nothing. on_token(id) is called with every
  // token it generates, as soon as it is sampled.
  uint64_t add(const GenerationRequest& request, std::function<void(int32_t)> on_token = {});
  // Removes a sequence before it finishes (its cache is released) and returns what it generated
  // so far, finish_reason "cancelled".
  GenerationResult drop(uint64_t key);

  size_t size() const { return seqs_.size(); }
  int64_t max_seq_len() const { return kv_.max_seq_len(); }  // prompt + new tokens of one sequence
  bool empty() const { return seqs_.empty(); }

  struct Finished {
    uint64_t key;
    GenerationResult result;
  };
  // Lookahead (with decode graphs; off unless set, LlmArgs::decode_lookahead): where every sequence
  // decodes greedily and none reaches its token limit with the coming token, the next decode step
  // is launched from the device (DecodeGraphs::step_chained: the coming tokens never visit the
  // host first) before this step's tokens are read back, so the device need not wait for the host
  // between steps. A
  // sequence that ends by eos has then had one step too many run for it, whose token is dropped
  // (its cache is released after that step, or at once when no sequence is left). The next
  // step() returns that step's tokens (StepInfo: no prompt tokens); a sequence added meanwhile
  // takes its prefill in the step() after.
  // (Measured on an H100 it made decode 1-2 % slower, not faster: docs/benchmarks.md.) Needs
  // decode graphs; without them it does nothing.
  void set_lookahead(bool on) { lookahead_enabled_ = on; }

  // One forward over every sequence: the prompt of each sequence added since the last step, one
  // token for the others, in the order they were added. Samples a token for each and returns the
  // sequences that finished (their caches released). Errors propagate: from the forward with
  // every sequence as before the step (it may be retried, e.g. without a sequence just added);
  // from a sampler or an on_token callback with every sequence dropped.
  std::vector<Finished> step(StepInfo* info = nullptr);

 private:
  struct Sequence;
  struct Launched;  // a step queued on the device, its tokens not yet read
  using SequenceList = std::vector<std::unique_ptr<Sequence>>;
  SequenceList::iterator find(uint64_t key);  // seqs_.end() when it is not there
  std::unique_ptr<Launched> launch();
  // The chained step after `now` (lookahead), or null where it cannot run.
  std::unique_ptr<Launched> launch_chained(const Launched& now);
  std::vector<int32_t> collect(Launched& step);  // waits for its tokens (or samples them)
  void release_when_done(int64_t cache_id);      // now, or after the step in flight that writes it
  // Waits for `step` (its tokens' copy, so the step itself), if any, then frees the caches it held.
  void finish_step(std::unique_ptr<Launched>& step);
  models::DeepseekV3ForCausalLM& model_;
  KvCacheManager& kv_;
  std::vector<int32_t> eos_;
  DecodeGraphs* graphs_;
  uint64_t next_key_ = 0;
  SequenceList seqs_;
  bool lookahead_enabled_ = false;
  std::unique_ptr<Launched> lookahead_;  // launched by the last step(), its tokens for the next
};

}  // namespace locus::runtime
