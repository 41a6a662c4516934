// The CUDA backend of the lane pool (Note [Lane pool] in cc/core/lane_pool.h)
// and the concurrent conv / matmul kernels that run on it. No TensorFlow
// headers: tools/gpu_check.sh builds and tests this with nvcc alone; the
// TensorFlow binding is cc/tf/kernels/concurrent_kernels_gpu.cu.cc.
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
#ifndef TF_GLP_CC_CUDA_LANE_POOL_CUDA_H_
#define TF_GLP_CC_CUDA_LANE_POOL_CUDA_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "cc/core/conv.h"
#include "cc/core/dtype.h"
#include "cc/core/gemm.h"
#include "cc/core/matmul.h"
#include "cc/core/work_plan.h"

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

// The concurrent ops on the GPU: the same work items as the CPU lanes run
// (Note [Work plan] in cc/core/work_plan.h), so results are bitwise the same
// for every lane count. Pointers are device pointers; workspace holds the
// floats that the core's Conv2D*Workspace(shape, num_lanes) functions say.
// Work is enqueued on lanes forked from and joined back to `stream`, with
// `device` current (the caller's device is restored).
std::string Conv2DForward(const core::Conv2DShape& shape, const float* input,
                          const float* filter, float* output, int num_lanes,
                          float* workspace, cudaStream_t stream, int device);
std::string Conv2DBackpropInput(const core::Conv2DShape& shape, const float* filter,
                                const float* output_grad, float* input_grad,
                                int num_lanes, float* workspace,
                                cudaStream_t stream, int device);
std::string Conv2DBackpropFilter(const core::Conv2DShape& shape, const float* input,
                                 const float* output_grad, float* filter_grad,
                                 int num_lanes, float* workspace,
                                 cudaStream_t stream, int device);
std::string MatMul(int64_t m, int64_t n, int64_t k, const float* a, const float* b,
                   bool transpose_b, float* c, int num_lanes, cudaStream_t stream,
                   int device);
std::string MatMulGradWeights(int64_t m, int64_t k, int64_t n, const float* a,
                              const float* output_grad, float* grad_weights,
                              int num_lanes, cudaStream_t stream, int device);

// 16-bit layers (mixed precision): inputs widened to float32, the float32
// ops above, the result rounded once (Note [Rounding to 16 bits] in
// cc/core/dtype.h), on `stream` with `device` current.
std::string ToFloat32(const void* input, core::DType dtype, float* output, int64_t count, cudaStream_t stream,
                      int device);
std::string FromFloat32(const float* input, core::DType dtype, void* output, int64_t count, cudaStream_t stream,
                        int device);

}  // namespace tf_glp::cuda

#endif  // TF_GLP_CC_CUDA_LANE_POOL_CUDA_H_
