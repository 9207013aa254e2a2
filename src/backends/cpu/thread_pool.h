// A fixed group of worker threads with a blocking parallel_for. The CPU backend runs every
// kernel on one of these; a locality domain on the CPU is one ThreadPool (its worker group).
// Work is split into contiguous chunks, and which thread computes an element never changes
// the arithmetic, so results do not depend on the thread count.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace locus::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // num_threads >= 1; the caller thread also works
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` items, in parallel, and
  // returns when all are done. Exceptions thrown by fn are rethrown here (the first one).
  // Calls from several threads are serialized; a nested call on the same pool from inside fn
  // runs inline on the calling thread.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool (LOCUS_NUM_THREADS or hardware concurrency threads).
  static ThreadPool& global();
  // The pool a Stream's native handle names (nullptr -> global()).
  static ThreadPool& from_native(void* native) {
    return native ? *static_cast<ThreadPool*>(native) : global();
  }

 private:
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex run_mu_;  // one parallel_for at a time per pool
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0, job_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace locus::cpu
