// How the core spreads work over threads without knowing whose threads they
// are: TensorFlow's intra-op pool in the op bindings, tf_glp's own ThreadPool
// in the native tests, or the calling thread alone.
#ifndef TF_GLP_CC_CORE_PARALLEL_H_
#define TF_GLP_CC_CORE_PARALLEL_H_

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

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_PARALLEL_H_
