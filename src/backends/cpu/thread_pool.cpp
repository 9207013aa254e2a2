#include "backends/cpu/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace locus::cpu {
namespace {
// The pool whose chunk the current thread is running, so that a nested parallel_for on the same
// pool runs inline instead of deadlocking on run_mu_.
thread_local const ThreadPool* tls_running_pool = nullptr;

struct RunningPoolScope {
  const ThreadPool* saved;
  explicit RunningPoolScope(const ThreadPool* p) : saved(tls_running_pool) { tls_running_pool = p; }
  ~RunningPoolScope() { tls_running_pool = saved; }
};
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  LOCUS_CHECK(num_threads >= 1, "ThreadPool needs at least one thread, got ", num_threads);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    ++active_;
    while (next_chunk_ < job_chunks_) {
      int64_t c = next_chunk_++;
      lock.unlock();
      int64_t b = c * job_chunk_, e = std::min(job_n_, b + job_chunk_);
      try {
        RunningPoolScope scope(this);
        (*job_)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);  // note: mu_ is not held here
        if (!error_) error_ = std::current_exception();
      }
      lock.lock();
    }
    if (--active_ == 0) cv_done_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t max_chunks = std::max<int64_t>(1, n / grain);
  int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(num_threads_) * 4);
  if (num_threads_ == 1 || chunks == 1 || tls_running_pool == this) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  job_chunks_ = chunks;
  next_chunk_ = 0;
  error_ = nullptr;
  ++generation_;
  ++active_;  // the calling thread works too
  cv_start_.notify_all();
  while (next_chunk_ < job_chunks_) {
    int64_t c = next_chunk_++;
    lock.unlock();
    int64_t b = c * chunk, e = std::min(n, b + chunk);
    try {
      RunningPoolScope scope(this);
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> g(mu_);
      if (!error_) error_ = std::current_exception();
    }
    lock.lock();
  }
  --active_;
  cv_done_.wait(lock, [&] { return active_ == 0; });
  job_ = nullptr;
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

ThreadPool& ThreadPool::global() {
  static ThreadPool* pool = [] {
    int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (const char* env = std::getenv("LOCUS_NUM_THREADS")) {
      int v = std::atoi(env);
      LOCUS_CHECK(v >= 1, "LOCUS_NUM_THREADS must be a positive integer, got '", env, "'");
      n = v;
    }
    return new ThreadPool(n);  // intentionally leaked: workers must outlive static destructors
  }();
  return *pool;
}

}  // namespace locus::cpu
