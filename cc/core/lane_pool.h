// Lanes: how the layer-concurrency ops (GLP4NN) run a layer's independent
// work items side by side. A CPU lane is a worker of a fixed thread pool; a
// CUDA lane is a stream of a per-device stream pool (cc/cuda/stream_pool.h,
// same contract).
//
// Note [Lane pool]
// ~~~~~~~~~~~~~~~~
// * A call asks for k lanes, 1 <= k <= kMaxLanes (CheckLaneCount says why a
//   k is refused; the ops turn that into InvalidArgumentError). k is a
//   request for concurrency, never a promise of it.
// * CPU: a call's lanes are tasks of a ParallelRunner (parallel.h). In the
//   TensorFlow ops that runner is the kernel's intra-op thread pool, so
//   tf_glp owns no threads of its own there: TensorFlow's pool bounds how
//   many lanes run at once (min(k, pool threads); the extra lanes run as
//   threads free up), and tf.config.threading.set_intra_op_parallelism_threads
//   bounds tf_glp as it bounds TensorFlow's own kernels, instead of a second
//   pool sized to the hardware oversubscribing the cores next to it. The
//   native tests and tools use CpuLanePool::Global(), a pool of tf_glp's own
//   (one thread per hardware thread; TF_GLP_CPU_LANE_THREADS overrides).
//   Several ops may call at once (TensorFlow runs independent ops
//   concurrently); each gets its own lanes and returns when its own items
//   are done.
// * Work items are handed to lanes dynamically (an atomic counter); each lane
//   runs on one thread at a time, so per-lane scratch needs no locking.
//   Which lane runs an item is unspecified: results must not depend on it
//   (Note [Concurrent determinism] in conv.h says how the ops ensure that).
// * CUDA (cc/cuda/stream_pool.h): per device, a pool of up to kMaxLanes
//   non-blocking streams, created lazily (the pool by std::call_once on the
//   first call for that device, lane i by the first call asking for more than
//   i lanes), each with its own cuBLAS handle and workspace, reused by every
//   later call and never destroyed. A call with k lanes uses lanes 0..k-1:
//   it records an event on the op's stream and makes each lane wait on it
//   (fork), enqueues item i on lane i % k, then records an event on each lane
//   and makes the op's stream wait on them (join), so work enqueued on the
//   op's stream before and after the op stays ordered with it. Calls from
//   several host threads share the streams; the events keep each call's fork
//   and join correct, and stream order serialises their use of a lane.
#ifndef TF_GLP_CC_CORE_LANE_POOL_H_
#define TF_GLP_CC_CORE_LANE_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cc/core/parallel.h"
#include "cc/core/thread_pool.h"

namespace tf_glp::core {

// The most lanes a call may ask for, on any backend.
constexpr int64_t kMaxLanes = 64;

// "" when 1 <= num_lanes <= kMaxLanes, else a message naming the bad value.
std::string CheckLaneCount(int64_t num_lanes);

class CpuLanePool {
 public:
  // Lanes on `runner`'s threads (not owned; must outlive the pool).
  explicit CpuLanePool(const ParallelRunner& runner) : runner_(&runner) {}
  // Lanes on a pool of num_threads threads of its own (the calling thread of
  // Run counts as one).
  explicit CpuLanePool(int num_threads);

  // tf_glp's own process-wide pool, for the native tests and tools (the ops
  // use TensorFlow's intra-op pool; Note [Lane pool]).
  static const CpuLanePool& Global();

  int NumThreads() const { return runner_->NumThreads(); }

  // Runs fn(lane, item) once for every item in [0, num_items) over
  // num_lanes lanes (clamped to [1, kMaxLanes]) and returns when all are
  // done. lane is in [0, num_lanes). If fn throws, the exception of the
  // lowest-numbered failing lane is rethrown after all lanes stop.
  void Run(int64_t num_lanes, int64_t num_items,
           const std::function<void(int lane, int64_t item)>& fn) const;

 private:
  std::unique_ptr<ThreadPool> own_pool_;
  const ParallelRunner* runner_;
};

// The lanes a call with num_lanes lanes and num_items items uses (lane
// indices are below it on every backend): per-lane workspace is sized by it.
inline int64_t LanesUsed(int64_t num_lanes, int64_t num_items) {
  int64_t lanes = num_lanes < kMaxLanes ? num_lanes : kMaxLanes;
  if (lanes > num_items) lanes = num_items;
  return lanes < 1 ? 1 : lanes;
}

// Splits [0, total) into `parts` contiguous ranges whose sizes differ by at
// most one; returns the start of range `index` (index == parts gives total).
inline int64_t SplitPoint(int64_t total, int64_t parts, int64_t index) {
  return total / parts * index + (index < total % parts ? index : total % parts);
}

}  // namespace tf_glp::core

#endif  // TF_GLP_CC_CORE_LANE_POOL_H_
