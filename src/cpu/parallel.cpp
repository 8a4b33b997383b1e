/// @file parallel.cpp
/// @brief The CPU backend's persistent thread pool, `parallel_for` and the thread-count setters.
#include "cpu/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cpu/merge.hpp"

namespace attnstate {
namespace cpu {
namespace detail {
namespace {

/// True on the pool's worker threads and on a caller while it runs chunks (nested calls inline).
thread_local bool t_inside_pool = false;

int default_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, kMaxThreads));
}

/// One parallel_for call shared by the caller and the workers.
struct Job {
  ChunkFn fn = nullptr;
  void* ctx = nullptr;
  std::int64_t begin = 0, end = 0, chunk = 1, num_chunks = 0;
  std::atomic<std::int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;

  void run_chunks() {
    for (;;) {
      const std::int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= num_chunks) return;
      const std::int64_t b = begin + c * chunk;
      const std::int64_t e = std::min(end, b + chunk);
      try {
        fn(ctx, b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
};

class ThreadPool {
 public:
  static ThreadPool& instance() {
    static ThreadPool pool;
    return pool;
  }
  ~ThreadPool() { resize_workers(0); }

  int threads() const { return requested_.load() > 0 ? requested_.load() : default_threads(); }
  void set_threads(int n) { requested_.store(n); }

  void run(std::int64_t begin, std::int64_t end, std::int64_t grain, ChunkFn fn, void* ctx) {
    const int nthreads = threads();
    std::unique_lock<std::mutex> use(use_mutex_, std::try_to_lock);
    if (nthreads <= 1 || t_inside_pool || !use.owns_lock()) {
      fn(ctx, begin, end);  // inline: one thread, nested call, or the pool is busy
      return;
    }
    if (static_cast<int>(workers_.size()) != nthreads - 1) resize_workers(nthreads - 1);

    Job job;
    job.fn = fn;
    job.ctx = ctx;
    job.begin = begin;
    job.end = end;
    const std::int64_t n = end - begin;
    const std::int64_t max_chunks = static_cast<std::int64_t>(nthreads) * 16;  // balance load
    const std::int64_t chunks = std::max<std::int64_t>(1, std::min(max_chunks, n / grain));
    job.chunk = (n + chunks - 1) / chunks;
    job.num_chunks = (n + job.chunk - 1) / job.chunk;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    start_cv_.notify_all();
    t_inside_pool = true;
    job.run_chunks();
    t_inside_pool = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [&] { return pending_ == 0; });
      job_ = nullptr;
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  ThreadPool() = default;

  void resize_workers(int n) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
    // A new worker starts from the current generation, so it only runs jobs posted after now.
    const std::uint64_t gen = generation_;
    try {
      workers_.reserve(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) workers_.emplace_back([this, gen] { worker_loop(gen); });
    } catch (const std::exception& e) {  // std::system_error, or bad_alloc for the vector
      const std::size_t started = workers_.size();
      resize_workers(0);  // stops and joins the workers that did start
      throw Error(Status::kResourceExhausted,
                  "attnstate::cpu: could not start " + std::to_string(n) +
                      " worker threads (set_num_threads; " + std::to_string(started) +
                      " started): " + e.what());
    }
  }

  void worker_loop(std::uint64_t seen) {
    t_inside_pool = true;
    for (;;) {
      Job* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      job->run_chunks();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (--pending_ == 0) done_cv_.notify_one();
      }
    }
  }

  std::atomic<int> requested_{0};
  std::mutex use_mutex_;  // one parallel_for at a time uses the workers
  std::mutex mutex_;      // guards the fields below
  std::condition_variable start_cv_, done_cv_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace

void parallel_for_impl(std::int64_t begin, std::int64_t end, std::int64_t grain, ChunkFn fn,
                       void* ctx) {
  ThreadPool::instance().run(begin, end, grain, fn, ctx);
}

int pool_threads() { return ThreadPool::instance().threads(); }

}  // namespace detail

int num_threads() { return detail::pool_threads(); }

void set_num_threads(int n) {
  if (n < 0 || n > kMaxThreads) {
    attnstate::detail::throw_argument("attnstate::cpu::set_num_threads", "n",
                                      "0.." + std::to_string(kMaxThreads) + " (0: the default)",
                                      std::to_string(n));
  }
  detail::ThreadPool::instance().set_threads(n);
}

}  // namespace cpu
}  // namespace attnstate
