// CUDA backend of the layer-concurrency ops (concurrent_kernels.h):
// cc/cuda/concurrent_ops.h on lanes forked from and joined back to the op's
// TensorFlow stream. Compiled only when setup.py finds nvcc.
#if GOOGLE_CUDA
#include <cuda_runtime.h>

#include <string>

#include "cc/cuda/concurrent_ops.h"
#include "cc/tf/kernels/concurrent_kernels.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"

namespace tf_glp::tf {
namespace {

absl::Status FromCuda(const std::string& error) {
  return error.empty() ? absl::OkStatus() : absl::InternalError(absl::StrCat("tf_glp (CUDA): ", error));
}

// The lane count, already checked (1..core::kMaxLanes), as cc/cuda takes it.
int Lanes(int64_t lanes) { return static_cast<int>(lanes); }

struct GpuBackend {
  struct Device {
    cudaStream_t stream = nullptr;
    int ordinal = 0;
  };

  // The op's CUDA stream and device ordinal.
  static absl::Status Open(tensorflow::OpKernelContext* ctx, Device* device) {
    auto* se_stream = ctx->op_device_context() == nullptr ? nullptr : ctx->op_device_context()->stream();
    if (se_stream == nullptr) return absl::InternalError("tf_glp: the op has no GPU stream");
    device->stream = static_cast<cudaStream_t>(se_stream->platform_specific_handle().stream);
    device->ordinal = se_stream->parent()->device_ordinal();
    if (device->stream == nullptr) return absl::InternalError("tf_glp: the GPU stream has no CUDA handle");
    return absl::OkStatus();
  }
  static absl::Status Zero(const Device& d, tensorflow::Tensor* output) {
    const cudaError_t status = cudaMemsetAsync(output->data(), 0, output->TotalBytes(), d.stream);
    return FromCuda(status == cudaSuccess ? "" : std::string("cudaMemsetAsync failed: ") + cudaGetErrorString(status));
  }
  static absl::Status ToFloat32(const Device& d, const void* input, core::DType dtype, float* output,
                                int64_t count) {
    return FromCuda(cuda::ToFloat32(input, dtype, output, count, d.stream, d.ordinal));
  }
  static absl::Status FromFloat32(const Device& d, const float* input, core::DType dtype, void* output,
                                  int64_t count) {
    return FromCuda(cuda::FromFloat32(input, dtype, output, count, d.stream, d.ordinal));
  }
  static absl::Status Conv2DForward(const Device& d, const core::Conv2DShape& s, const float* input,
                                    const float* filter, float* output, int64_t lanes, float* workspace) {
    return FromCuda(cuda::Conv2DForward(s, input, filter, output, Lanes(lanes), workspace, d.stream, d.ordinal));
  }
  static absl::Status Conv2DBackpropInput(const Device& d, const core::Conv2DShape& s, const float* filter,
                                          const float* output_grad, float* input_grad, int64_t lanes,
                                          float* workspace) {
    return FromCuda(
        cuda::Conv2DBackpropInput(s, filter, output_grad, input_grad, Lanes(lanes), workspace, d.stream, d.ordinal));
  }
  static absl::Status Conv2DBackpropFilter(const Device& d, const core::Conv2DShape& s, const float* input,
                                           const float* output_grad, float* filter_grad, int64_t lanes,
                                           float* workspace) {
    return FromCuda(
        cuda::Conv2DBackpropFilter(s, input, output_grad, filter_grad, Lanes(lanes), workspace, d.stream, d.ordinal));
  }
  static absl::Status MatMul(const Device& d, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
                             bool transpose_b, float* c, int64_t lanes) {
    return FromCuda(cuda::MatMul(m, n, k, a, b, transpose_b, c, Lanes(lanes), d.stream, d.ordinal));
  }
  static absl::Status MatMulGradWeights(const Device& d, int64_t m, int64_t k, int64_t n, const float* a,
                                        const float* output_grad, float* grad_weights, int64_t lanes) {
    return FromCuda(
        cuda::MatMulGradWeights(m, k, n, a, output_grad, grad_weights, Lanes(lanes), d.stream, d.ordinal));
  }
};

using tensorflow::DEVICE_GPU;
TF_GLP_REGISTER_CONCURRENT_KERNELS(DEVICE_GPU, GpuBackend, float);
TF_GLP_REGISTER_CONCURRENT_KERNELS(DEVICE_GPU, GpuBackend, Eigen::half);
TF_GLP_REGISTER_CONCURRENT_KERNELS(DEVICE_GPU, GpuBackend, Eigen::bfloat16);

}  // namespace
}  // namespace tf_glp::tf
#endif  // GOOGLE_CUDA
