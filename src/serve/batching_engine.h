// Runs generation requests that arrive concurrently (HTTP handler threads) on one worker thread:
// it takes every waiting request, up to max_batch, runs them as one Generator batch, and hands
// each its result. Requests that arrive while a batch runs wait for the next one. A request that
// fails (an Error from the model or the KV cache) fails alone; the worker keeps serving.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "runtime/generator.h"

namespace locus::serve {

struct EngineRequest {
  runtime::GenerationRequest generation;  // sampling.seed is the request's own seed
  // Called on the worker thread with every token the request generates, as it is sampled.
  std::function<void(int32_t)> on_token;
};

class BatchingEngine {
 public:
  BatchingEngine(runtime::Generator& generator, int max_batch);
  ~BatchingEngine();  // finishes the running batch, fails the waiting requests, joins the worker
  BatchingEngine(const BatchingEngine&) = delete;
  BatchingEngine& operator=(const BatchingEngine&) = delete;

  std::future<runtime::GenerationResult> submit(EngineRequest request);

 private:
  struct Pending {
    EngineRequest request;
    std::promise<runtime::GenerationResult> done;
  };
  void run();
  void run_alone(Pending& p);

  runtime::Generator& generator_;
  int max_batch_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace locus::serve
