#include "serve/batching_engine.h"

#include <algorithm>

#include "core/error.h"

namespace locus::serve {

BatchingEngine::BatchingEngine(models::DeepseekV3ForCausalLM& model, runtime::KvCacheManager& kv,
                               std::vector<int32_t> eos_ids, int max_batch, runtime::DecodeGraphs* graphs,
                               bool lookahead)
    : stepper_(model, kv, std::move(eos_ids), graphs), max_batch_(max_batch) {
  LOCUS_CHECK(max_batch >= 1, "BatchingEngine: max_batch must be >= 1, got ", max_batch);
  stepper_.set_lookahead(lookahead);
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

int64_t BatchingEngine::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

int BatchingEngine::max_batch_seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_batch_seen_;
}

void BatchingEngine::admit(std::deque<Pending>& arrived) {
  while (!arrived.empty()) {
    Pending& p = arrived.front();
    try {
      const uint64_t key = stepper_.add(p.request.generation, p.request.on_token);
      in_flight_.emplace(key, InFlight{std::move(p.done), std::move(p.request.cancelled)});
      just_added_.push_back(key);
    } catch (...) {
      const int64_t tokens = static_cast<int64_t>(p.request.generation.prompt.size()) + p.request.generation.max_new_tokens;
      if (!stepper_.empty() && tokens <= stepper_.max_seq_len()) {
        // The KV cache is full with the requests in flight: this one and those behind it wait
        // (in order) for some to end.
        std::lock_guard<std::mutex> lock(mu_);
        while (!arrived.empty()) {
          queue_.push_front(std::move(arrived.back()));
          arrived.pop_back();
        }
        return;
      }
      p.done.set_exception(std::current_exception());  // it does not fit even alone: it fails
    }
    arrived.pop_front();
  }
}

void BatchingEngine::step() {
  std::vector<runtime::BatchStepper::Finished> finished;
  runtime::BatchStepper::StepInfo info;
  try {
    finished = stepper_.step(&info);
  } catch (...) {
    const auto error = std::current_exception();
    const bool retry = !stepper_.empty() && !just_added_.empty() && just_added_.size() < stepper_.size();
    // The forward failed with every sequence intact: when it held requests just added next to
    // running ones, those new ones fail and the others go on; otherwise everything in flight fails.
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      const bool fresh = std::find(just_added_.begin(), just_added_.end(), it->first) != just_added_.end();
      if (retry && !fresh) {
        ++it;
        continue;
      }
      if (!stepper_.empty()) stepper_.drop(it->first);
      it->second.done.set_exception(error);
      it = in_flight_.erase(it);
    }
    just_added_.clear();
    return;
  }
  // The requests just added took their prefill in this step, unless it was a lookahead step
  // launched before they came (no prompts then): they stay fresh until their own.
  if (info.prompt_tokens > 0) just_added_.clear();
  for (auto& f : finished) {
    auto it = in_flight_.find(f.key);
    it->second.done.set_value(std::move(f.result));
    in_flight_.erase(it);
  }
  drop_cancelled();
}

void BatchingEngine::drop_cancelled() {
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    bool cancel = false;
    try {
      cancel = it->second.cancelled && it->second.cancelled();
    } catch (...) {
      cancel = true;
    }
    if (!cancel) {
      ++it;
      continue;
    }
    it->second.done.set_value(stepper_.drop(it->first));
    it = in_flight_.erase(it);
  }
}

void BatchingEngine::run() {
  while (true) {
    std::deque<Pending> arrived;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !stepper_.empty(); });
      if (stopping_) {
        for (auto& p : queue_) p.done.set_exception(std::make_exception_ptr(Error("the server is shutting down")));
        queue_.clear();
      }
      while (!queue_.empty() && static_cast<int>(stepper_.size() + arrived.size()) < max_batch_) {
        arrived.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    admit(arrived);
    if (stepper_.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++steps_;
      max_batch_seen_ = std::max(max_batch_seen_, static_cast<int>(stepper_.size()));
    }
    step();
  }
}

}  // namespace locus::serve
