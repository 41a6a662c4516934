// A fixed pool of worker threads: the CPU backend for ParallelFor.
//
// Contract:
//  * The pool starts `num_threads - 1` workers once, in the constructor; the
//    thread calling ParallelFor is the last worker, so a pool of 1 runs
//    everything inline. No thread is created per call.
//  * ParallelFor may be called from several threads at once (TensorFlow runs
//    independent ops concurrently); each call's tasks are shared by the idle
//    workers and its caller, and the call returns when its own tasks are done.
//  * Tasks are handed out one at a time in index order; which thread runs a
//    task is unspecified, so results must not depend on it.
//  * The destructor waits for running calls' tasks and joins the workers.
#ifndef TF_GLP_CC_CORE_THREAD_POOL_H_
#define TF_GLP_CC_CORE_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cc/core/parallel.h"

namespace tf_glp::core {

class ThreadPool final : public ParallelRunner {
 public:
  // num_threads counts the caller; must be >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool() override;

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int NumThreads() const override { return num_threads_; }
  void ParallelFor(
      int64_t num_tasks,
      const std::function<void(int64_t, int64_t)>& fn) const override;

 private:
  struct Job;
  void WorkerLoop();
  static void RunTasks(Job* job);

  const int num_threads_;
  mutable std::mutex mutex_;
  mutable std::condition_variable work_available_;
  mutable std::deque<std::shared_ptr<Job>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_THREAD_POOL_H_
