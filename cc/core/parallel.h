// How the core spreads work over threads without knowing whose threads they
// are: TensorFlow's intra-op pool in the op bindings, tf_glp's own ThreadPool
// in the native tests, or the calling thread alone.
#ifndef TF_GLP_CC_CORE_PARALLEL_H_
#define TF_GLP_CC_CORE_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <functional>

namespace tf_glp::core {

class ParallelRunner {
 public:
  virtual ~ParallelRunner() = default;

  // Number of threads that may run tasks at once (at least 1).
  virtual int NumThreads() const = 0;

  // Runs fn(begin, end) over disjoint ranges that together cover
  // [0, num_tasks), possibly concurrently, and returns when all are done.
  // Callers must not depend on how tasks are grouped into ranges.
  virtual void ParallelFor(
      int64_t num_tasks,
      const std::function<void(int64_t begin, int64_t end)>& fn) const = 0;
};

// Runs everything on the calling thread.
class SerialRunner final : public ParallelRunner {
 public:
  int NumThreads() const override { return 1; }
  void ParallelFor(
      int64_t num_tasks,
      const std::function<void(int64_t, int64_t)>& fn) const override {
    if (num_tasks > 0) fn(0, num_tasks);
  }
};

// Below this many bytes moved, elementwise work runs on the calling thread:
// waking other threads costs more than it saves.
constexpr int64_t kSerialBytesThreshold = 1 << 20;
// Elements per task handed to a runner by RunElementwise (a multiple of every
// vector width, so only a buffer's last task has a scalar tail).
constexpr int64_t kElementsPerTask = 16 << 10;

// Runs kernel(begin, end) over [0, num_elements): on the calling thread when
// the work is small or the runner has one thread, else in tasks of
// kElementsPerTask elements on the runner. For elementwise kernels whose
// result does not depend on how the range is split.
template <class Kernel>
void RunElementwise(const ParallelRunner& runner, int64_t num_elements,
                    int64_t bytes_moved, const Kernel& kernel) {
  if (bytes_moved < kSerialBytesThreshold || runner.NumThreads() == 1) {
    kernel(int64_t{0}, num_elements);
    return;
  }
  const int64_t num_tasks = (num_elements + kElementsPerTask - 1) / kElementsPerTask;
  runner.ParallelFor(num_tasks, [&](int64_t first, int64_t last) {
    kernel(first * kElementsPerTask, std::min(last * kElementsPerTask, num_elements));
  });
}

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_PARALLEL_H_
