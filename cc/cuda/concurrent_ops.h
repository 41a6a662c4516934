// The layer-concurrency ops on the GPU (GLP4NN): convolution and matrix
// products run over the CUDA lanes of stream_pool.h, and the 16-bit
// conversions of mixed precision. No TensorFlow headers (tools/gpu_check.sh
// builds and tests this with nvcc alone); the TensorFlow binding is
// cc/tf/kernels/concurrent_kernels_gpu.cu.cc.
#ifndef TF_GLP_CC_CUDA_CONCURRENT_OPS_H_
#define TF_GLP_CC_CUDA_CONCURRENT_OPS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cc/core/conv.h"
#include "cc/core/dtype.h"
#include "cc/core/matmul.h"
#include "cc/core/work_plan.h"
#include "cc/cuda/stream_pool.h"

namespace tf_glp::cuda {

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

extern "C" {
// The im2col kernel's launch resources as compiled for the current device
// (threads per block, registers per thread, static shared memory per block),
// for the start-up profiler's occupancy model: tf_glp/profiling/gpu_device.py
// reads it with ctypes from the op library. Returns 0, or the cudaError_t.
__attribute__((visibility("default"))) int tf_glp_im2col_launch(int* threads_per_block,
                                                                int* registers_per_thread,
                                                                int* shared_bytes_per_block);
}  // extern "C"

#endif  // TF_GLP_CC_CUDA_CONCURRENT_OPS_H_
