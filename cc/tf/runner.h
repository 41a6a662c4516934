// Adapters from TensorFlow kernels to the core: TensorFlow's intra-op thread
// pool as a core::ParallelRunner, and dtype mapping.
#ifndef TF_GLP_CC_TF_RUNNER_H_
#define TF_GLP_CC_TF_RUNNER_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "cc/core/dtype.h"
#include "cc/core/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tf_glp::tf {

// Runs the core's tasks on the intra-op pool of the kernel's CPU device.
class IntraOpRunner final : public core::ParallelRunner {
 public:
  explicit IntraOpRunner(tensorflow::OpKernelContext* ctx)
      : pool_(ctx->device()->tensorflow_cpu_worker_threads()->workers) {}

  int NumThreads() const override {
    return pool_ == nullptr ? 1 : pool_->NumThreads();
  }

  void ParallelFor(
      int64_t num_tasks,
      const std::function<void(int64_t, int64_t)>& fn) const override {
    if (pool_ == nullptr || num_tasks <= 1) {
      if (num_tasks > 0) fn(0, num_tasks);
      return;
    }
    // A task is a block of core::kElementsPerTask elements or a lane of a
    // layer-concurrency op, far more than the pool's scheduling overhead:
    // give a high cost so every task may run on its own thread.
    constexpr int64_t kCyclesPerTask = 1 << 20;
    pool_->ParallelFor(num_tasks, kCyclesPerTask, fn);
  }

 private:
  tensorflow::thread::ThreadPool* pool_;
};

inline std::optional<core::DType> ToCoreDType(tensorflow::DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_FLOAT:
      return core::DType::kFloat32;
    case tensorflow::DT_BFLOAT16:
      return core::DType::kBFloat16;
    case tensorflow::DT_HALF:
      return core::DType::kFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace tf_glp::tf

#endif  // TF_GLP_CC_TF_RUNNER_H_
