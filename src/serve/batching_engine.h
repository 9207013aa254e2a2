// Runs generation requests that arrive concurrently (HTTP handler threads) on one worker thread
// with continuous batching: between two forward passes the worker adds every waiting request
// (up to max_batch sequences in flight; a new one's first step is its prefill, alongside the
// others' decode steps), and a request leaves the batch as soon as it ends. A request whose KV
// cache does not fit next to those in flight waits for some to end; one that fails (it does not
// fit even alone, the model rejects it) fails alone; the worker keeps serving.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/batch_stepper.h"

namespace locus::serve {

struct EngineRequest {
  runtime::GenerationRequest generation;  // sampled with its own sampling.seed
  // Called on the worker thread with every token the request generates, as it is sampled. It
  // must not throw (an exception there ends every request in flight).
  std::function<void(int32_t)> on_token;
  // Polled on the worker thread after every step: true ends the request there (its result holds
  // the tokens so far, finish_reason "cancelled"), e.g. when a stop string has appeared or the
  // client has gone away.
  std::function<bool()> cancelled;
};

class BatchingEngine {
 public:
  // graphs: optional, outliving the engine; lookahead: with graphs (runtime::BatchStepper).
  BatchingEngine(models::DeepseekV3ForCausalLM& model, runtime::KvCacheManager& kv, std::vector<int32_t> eos_ids,
                 int max_batch, runtime::DecodeGraphs* graphs = nullptr, bool lookahead = false);
  ~BatchingEngine();  // finishes the requests in flight, fails the waiting ones, joins the worker
  BatchingEngine(const BatchingEngine&) = delete;
  BatchingEngine& operator=(const BatchingEngine&) = delete;

  std::future<runtime::GenerationResult> submit(EngineRequest request);

  // Forward passes run so far and the most sequences one of them held (for tests and logs).
  int64_t steps() const;
  int max_batch_seen() const;

 private:
  struct Pending {
    EngineRequest request;
    std::promise<runtime::GenerationResult> done;
  };
  void run();
  void admit(std::deque<Pending>& arrived);
  void step();  // one forward pass; a failure fails the requests it concerns
  void drop_cancelled();

  runtime::BatchStepper stepper_;  // used by the worker only
  int max_batch_;
  struct InFlight {
    std::promise<runtime::GenerationResult> done;
    std::function<bool()> cancelled;
  };
  std::map<uint64_t, InFlight> in_flight_;  // by stepper key
  std::vector<uint64_t> just_added_;                                        // keys not stepped yet

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  int64_t steps_ = 0;
  int max_batch_seen_ = 0;
  std::thread worker_;
};

}  // namespace locus::serve
