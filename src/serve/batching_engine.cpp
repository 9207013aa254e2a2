#include "serve/batching_engine.h"

#include <vector>

#include "core/error.h"

namespace locus::serve {

BatchingEngine::BatchingEngine(runtime::Generator& generator, int max_batch)
    : generator_(generator), max_batch_(max_batch) {
  LOCUS_CHECK(max_batch >= 1, "BatchingEngine: max_batch must be >= 1, got ", max_batch);
  worker_ = std::thread([this] { run(); });
}

BatchingEngine::~BatchingEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

std::future<runtime::GenerationResult> BatchingEngine::submit(EngineRequest request) {
  Pending p{std::move(request), {}};
  auto f = p.done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      p.done.set_exception(std::make_exception_ptr(Error("the server is shutting down")));
      return f;
    }
    queue_.push_back(std::move(p));
  }
  wake_.notify_one();
  return f;
}

void BatchingEngine::run() {
  while (true) {
    std::vector<Pending> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        for (auto& p : queue_) p.done.set_exception(std::make_exception_ptr(Error("the server is shutting down")));
        queue_.clear();
        return;
      }
      while (!queue_.empty() && static_cast<int>(batch.size()) < max_batch_) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<runtime::GenerationRequest> reqs;
    for (size_t i = 0; i < batch.size(); ++i) {
      reqs.push_back(batch[i].request.generation);
      // The generator samples sequence i with seed + i; undo that so that a request's tokens do
      // not depend on where in a batch it lands.
      reqs.back().sampling.seed -= i;
    }
    bool emitted = false;
    try {
      auto results = generator_.generate(reqs, [&](size_t i, int32_t id) {
        emitted = true;
        if (batch[i].request.on_token) batch[i].request.on_token(id);
      });
      for (size_t i = 0; i < batch.size(); ++i) batch[i].done.set_value(std::move(results[i]));
    } catch (...) {
      // A batch that failed before its first token (the KV cache budget, a request the model
      // rejects) is retried one request at a time, so that one request cannot fail the others.
      if (batch.size() > 1 && !emitted) {
        for (auto& p : batch) run_alone(p);
      } else {
        for (auto& p : batch) p.done.set_exception(std::current_exception());
      }
    }
  }
}

void BatchingEngine::run_alone(Pending& p) {
  try {
    auto results = generator_.generate({p.request.generation}, [&](size_t, int32_t id) {
      if (p.request.on_token) p.request.on_token(id);
    });
    p.done.set_value(std::move(results[0]));
  } catch (...) {
    p.done.set_exception(std::current_exception());
  }
}

}  // namespace locus::serve
