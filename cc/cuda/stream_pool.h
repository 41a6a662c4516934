// The CUDA lanes (Note [Lane pool] in cc/core/lane_pool.h): a per-device pool
// of streams, each with its own cuBLAS handle, the GEMM a lane runs (cuBLAS
// through dlopen, or a built-in kernel), and OnLanes, which runs a layer's
// work items on lanes forked from and joined back to the op's stream. No
// TensorFlow headers: tools/gpu_check.sh builds and tests this with nvcc
// alone. The ops that run on the lanes are concurrent_ops.h.
//
// Why our own streams: TensorFlow enqueues all of a GPU's kernels on one
// compute stream, so the small per-sample GEMMs of a layer run one after the
// other even when each fills a fraction of the GPU. GLP4NN runs them on
// several streams at once. Each lane has its own cuBLAS handle (bound to its
// stream once, never rebound) and its own cuBLAS workspace, which is also what
// cuBLAS needs for bitwise reproducible results across streams.
//
// Why the fork/join events: TensorFlow's allocator may hand the memory of a
// tensor freed after this op to the next op on TensorFlow's stream at once,
// trusting stream order. Work on our lanes would escape that order, so every
// call starts its lanes after an event recorded on the op's stream (fork) and
// makes the op's stream wait for an event recorded on each lane (join); to
// TensorFlow the op is then one ordinary step on its stream.
//
// Every function returns "" or an error message; none throws or aborts.
#ifndef TF_GLP_CC_CUDA_STREAM_POOL_H_
#define TF_GLP_CC_CUDA_STREAM_POOL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "cc/core/gemm.h"
#include "cc/core/lane_pool.h"

namespace tf_glp::cuda {

struct Lane {
  cudaStream_t stream = nullptr;
  void* blas = nullptr;            // cublasHandle_t, or null: built-in GEMM
  void* blas_workspace = nullptr;  // device memory owned by the pool
};

class StreamPool {
 public:
  // The pool of `device`, created on first use (std::call_once) and never
  // destroyed. On failure returns null and sets *error.
  static StreamPool* ForDevice(int device, std::string* error);

  // Makes sure lanes 0..num_lanes-1 exist: a lane's stream, cuBLAS handle
  // and workspace are created by the first call that asks for it, then kept
  // and reused (at most core::kMaxLanes).
  std::string EnsureLanes(int num_lanes);

  Lane& lane(int i) { return lanes_[i]; }
  int created_lanes() const { return created_; }

  // Lanes 0..num_lanes-1 wait for the work enqueued so far on `parent`.
  std::string Fork(cudaStream_t parent, int num_lanes);
  // `parent` waits for the work enqueued so far on lanes 0..num_lanes-1.
  std::string Join(cudaStream_t parent, int num_lanes);

 private:
  explicit StreamPool(int device) : device_(device) {}

  const int device_;
  std::mutex mutex_;  // guards lane creation
  int created_ = 0;
  Lane lanes_[core::kMaxLanes];
};

// Whether cuBLAS could be loaded (dlopen of libcublas.so.<the CUDA runtime's
// major version>); otherwise a built-in tiled GEMM kernel is used. Sets
// *which to the library name.
bool CublasAvailable(std::string* which);

// C (+)= op(A) op(B) (the row-major GemmArgs of cc/core/gemm.h; pointers are
// device pointers) on one lane. force_builtin: skip cuBLAS (for tests).
std::string LaneGemm(Lane& lane, const core::GemmArgs& args, bool force_builtin = false);

inline std::string CudaError(const char* what, cudaError_t status) {
  return std::string(what) + " failed: " + cudaGetErrorString(status);
}

#define TF_GLP_CUDA_RETURN_IF_ERROR(call)                      \
  do {                                                         \
    const cudaError_t tf_glp_status = (call);                  \
    if (tf_glp_status != cudaSuccess) return CudaError(#call, tf_glp_status); \
  } while (0)

// Grid size for a grid-stride kernel over `total` elements, 256 threads a block.
inline int Blocks(int64_t total) {
  return static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096));
}

// Makes `device` current for the scope and restores the caller's: the lanes'
// streams, and every kernel launched on them or on the op's stream, belong to
// `device` (TensorFlow normally has it current already).
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {}
  std::string Enter() {
    TF_GLP_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    if (previous_ != device_) TF_GLP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    entered_ = true;
    return "";
  }
  ~DeviceScope() {
    if (entered_ && previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  const int device_;
  int previous_ = 0;
  bool entered_ = false;
};

// Runs body(lane, index, item) for every item, item i on lane i % lanes,
// between a fork from and a join back to `stream`; then after() on `stream`
// (still on `device`), when every item was enqueued without error.
template <class Body, class After>
std::string OnLanes(int device, cudaStream_t stream, int num_lanes, int64_t items, Body body, After after) {
  std::string error = core::CheckLaneCount(num_lanes);
  if (!error.empty()) return error;
  StreamPool* pool = StreamPool::ForDevice(device, &error);
  if (pool == nullptr) return error;
  const int lanes = static_cast<int>(core::LanesUsed(num_lanes, items));
  error = pool->EnsureLanes(lanes);
  if (!error.empty()) return error;
  DeviceScope scope(device);
  error = scope.Enter();
  if (!error.empty()) return error;
  error = pool->Fork(stream, lanes);
  if (!error.empty()) return error;
  std::string first_error;
  for (int64_t item = 0; item < items; ++item) {
    const int lane = static_cast<int>(item % lanes);
    first_error = body(pool->lane(lane), lane, item);
    if (!first_error.empty()) break;
  }
  // Join even after an error, so the op's stream never runs ahead of work
  // already enqueued on the lanes.
  error = pool->Join(stream, lanes);
  if (first_error.empty()) first_error = error;
  return first_error.empty() ? after() : first_error;
}

template <class Body>
std::string OnLanes(int device, cudaStream_t stream, int num_lanes, int64_t items, Body body) {
  return OnLanes(device, stream, num_lanes, items, body, [] { return std::string(); });
}

}  // namespace tf_glp::cuda

#endif  // TF_GLP_CC_CUDA_STREAM_POOL_H_
