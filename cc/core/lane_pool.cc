#include "cc/core/lane_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

namespace tf_glp::core {

std::string CheckLaneCount(int64_t num_lanes) {
  if (num_lanes < 1 || num_lanes > kMaxLanes) {
    return "concurrency (the number of lanes) must be between 1 and " +
           std::to_string(kMaxLanes) + ", got " + std::to_string(num_lanes);
  }
  return "";
}

CpuLanePool::CpuLanePool(int num_threads)
    : own_pool_(std::make_unique<ThreadPool>(std::max(1, num_threads))), runner_(own_pool_.get()) {}

const CpuLanePool& CpuLanePool::Global() {
  static const CpuLanePool* pool = [] {
    int threads = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("TF_GLP_CPU_LANE_THREADS")) {
      const int wanted = std::atoi(env);
      if (wanted >= 1) threads = wanted;
    }
    threads = std::min<int>(std::max(threads, 1), static_cast<int>(kMaxLanes));
    return new CpuLanePool(threads);  // Never destroyed: used until exit.
  }();
  return *pool;
}

void CpuLanePool::Run(
    int64_t num_lanes, int64_t num_items,
    const std::function<void(int lane, int64_t item)>& fn) const {
  if (num_items <= 0) return;
  const int64_t lanes = LanesUsed(num_lanes, num_items);
  if (lanes == 1) {
    for (int64_t item = 0; item < num_items; ++item) fn(0, item);
    return;
  }
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::exception_ptr> errors(lanes);
  runner_->ParallelFor(lanes, [&](int64_t begin, int64_t end) {
    for (int64_t lane = begin; lane < end; ++lane) {
      try {
        for (;;) {
          if (failed.load(std::memory_order_relaxed)) break;
          const int64_t item = next.fetch_add(1, std::memory_order_relaxed);
          if (item >= num_items) break;
          fn(static_cast<int>(lane), item);
        }
      } catch (...) {
        errors[lane] = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
  });
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace tf_glp::core
