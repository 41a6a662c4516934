#include "cc/core/thread_pool.h"

#include <atomic>
#include <stdexcept>
#include <string>

namespace tf_glp::core {

struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t num_tasks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};
  std::mutex mutex;
  std::condition_variable all_finished;
};

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  if (num_threads < 1) {
    throw std::invalid_argument("ThreadPool needs at least 1 thread, got " +
                                std::to_string(num_threads));
  }
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::RunTasks(Job* job) {
  int64_t done = 0;
  for (;;) {
    const int64_t task = job->next.fetch_add(1, std::memory_order_relaxed);
    if (task >= job->num_tasks) break;
    (*job->fn)(task, task + 1);
    ++done;
  }
  if (done > 0 &&
      job->finished.fetch_add(done, std::memory_order_acq_rel) + done ==
          job->num_tasks) {
    std::lock_guard<std::mutex> lock(job->mutex);
    job->all_finished.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_available_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping_ and nothing left to help with.
      job = jobs_.front();
      // A job stays queued until all its tasks are handed out, so that every
      // idle worker can join in.
      if (job->next.load(std::memory_order_relaxed) >= job->num_tasks) {
        jobs_.pop_front();
        continue;
      }
    }
    RunTasks(job.get());
  }
}

void ThreadPool::ParallelFor(
    int64_t num_tasks, const std::function<void(int64_t, int64_t)>& fn) const {
  if (num_tasks <= 0) return;
  if (num_threads_ == 1 || num_tasks == 1) {
    fn(0, num_tasks);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->num_tasks = num_tasks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(job);
  }
  work_available_.notify_all();
  RunTasks(job.get());
  {
    std::unique_lock<std::mutex> lock(job->mutex);
    job->all_finished.wait(lock, [&] {
      return job->finished.load(std::memory_order_acquire) == job->num_tasks;
    });
  }
  // Drop the job from the queue if no worker has done so yet.
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if (it->get() == job.get()) {
      jobs_.erase(it);
      break;
    }
  }
}

}  // namespace tf_glp::core
