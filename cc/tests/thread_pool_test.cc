// ThreadPool's contract: every task exactly once, no threads made per call,
// concurrent callers, and a pool of one running inline.
#include "cc/core/thread_pool.h"

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cc/tests/test_main.h"

namespace tf_glp::core {
namespace {

TEST(EveryTaskRunsExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 2, 5, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1);
  }
}

TEST(ReusesItsThreads) {
  ThreadPool pool(3);
  std::mutex mutex;
  std::set<std::thread::id> seen;
  for (int call = 0; call < 200; ++call) {
    pool.ParallelFor(16, [&](int64_t, int64_t) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.insert(std::this_thread::get_id());
    });
  }
  // The three pool threads (two workers and this caller), never more.
  EXPECT_TRUE(seen.size() <= 3);
  EXPECT_TRUE(seen.count(std::this_thread::get_id()) == 1);
}

TEST(ConcurrentCallersEachGetTheirTasksDone) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) {
        std::atomic<int64_t> mine{0};
        pool.ParallelFor(37, [&](int64_t b, int64_t e) { mine += e - b; });
        if (mine.load() != 37) throw std::runtime_error("lost tasks");
        total += mine.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t{4 * 50 * 37});
}

TEST(PoolOfOneRunsInline) {
  ThreadPool pool(1);
  std::thread::id ran_on;
  pool.ParallelFor(3, [&](int64_t, int64_t) { ran_on = std::this_thread::get_id(); });
  EXPECT_TRUE(ran_on == std::this_thread::get_id());
  bool threw = false;
  try {
    ThreadPool bad(0);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
}

}  // namespace
}  // namespace tf_glp::core

TF_GLP_TEST_MAIN
