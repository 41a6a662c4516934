// CUDA kernels of the layer-concurrency ops: the checks and allocation shared
// with the CPU kernels (Prepare* in concurrent_common.h), then
// cc/cuda/lane_pool_cuda.h on lanes forked from and joined back to the op's
// TensorFlow stream. Compiled only when setup.py finds nvcc.
#if GOOGLE_CUDA
#include <cuda_runtime.h>

#include "cc/core/conv.h"
#include "cc/core/matmul.h"
#include "cc/cuda/lane_pool_cuda.h"
#include "cc/tf/kernels/concurrent_common.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "xla/stream_executor/stream.h"
#include "xla/stream_executor/stream_executor.h"

namespace tf_glp::tf {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

float* Data(Tensor* t) { return t->flat<float>().data(); }
const float* Data(const Tensor& t) { return t.flat<float>().data(); }

// The op's CUDA stream and device ordinal.
absl::Status OpStream(OpKernelContext* ctx, cudaStream_t* stream, int* device) {
  auto* se_stream = ctx->op_device_context() == nullptr ? nullptr : ctx->op_device_context()->stream();
  if (se_stream == nullptr) return absl::InternalError("tf_glp: the op has no GPU stream");
  *stream = static_cast<cudaStream_t>(se_stream->platform_specific_handle().stream);
  *device = se_stream->parent()->device_ordinal();
  if (*stream == nullptr) return absl::InternalError("tf_glp: the GPU stream has no CUDA handle");
  return absl::OkStatus();
}

absl::Status Workspace(OpKernelContext* ctx, int64_t elements, Tensor* out) {
  return ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({std::max<int64_t>(1, elements)}), out);
}

absl::Status FromCuda(const char* op, const std::string& error) {
  return error.empty() ? absl::OkStatus() : absl::InternalError(absl::StrCat(op, ": ", error));
}

// Zeroes an output on the op's stream (the kZeroOutput case of Prepare*).
absl::Status ZeroOutput(const char* op, Tensor* output, cudaStream_t stream) {
  const cudaError_t status = cudaMemsetAsync(Data(output), 0, sizeof(float) * output->NumElements(), stream);
  return FromCuda(op, status == cudaSuccess ? "" : "cudaMemsetAsync failed");
}

class ConcurrentConv2DGpuOp : public OpKernel {
 public:
  explicit ConcurrentConv2DGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }
  void Compute(OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2D(ctx, attrs_, kOp, &shape, &output, &work));
    if (work == Work::kNone) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DForwardWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::Conv2DForward(shape, Data(ctx->input(0)), Data(ctx->input(1)),
                                                           Data(output), attrs_.lanes, Data(&workspace), stream,
                                                           device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d";
  ConvAttrs attrs_;
};

class ConcurrentConv2DBackpropInputGpuOp : public OpKernel {
 public:
  explicit ConcurrentConv2DBackpropInputGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }
  void Compute(OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2DBackpropInput(ctx, attrs_, kOp, &shape, &output, &work));
    if (work == Work::kNone) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropInputWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::Conv2DBackpropInput(shape, Data(ctx->input(1)), Data(ctx->input(2)),
                                                                 Data(output), attrs_.lanes, Data(&workspace),
                                                                 stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_input";
  ConvAttrs attrs_;
};

class ConcurrentConv2DBackpropFilterGpuOp : public OpKernel {
 public:
  explicit ConcurrentConv2DBackpropFilterGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx, kOp));
  }
  void Compute(OpKernelContext* ctx) override {
    core::Conv2DShape shape;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareConv2DBackpropFilter(ctx, attrs_, kOp, &shape, &output, &work));
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    if (work == Work::kZeroOutput) {
      OP_REQUIRES_OK(ctx, ZeroOutput(kOp, output, stream));
      return;
    }
    Tensor workspace;
    OP_REQUIRES_OK(ctx, Workspace(ctx, core::Conv2DBackpropFilterWorkspace(shape, attrs_.lanes), &workspace));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::Conv2DBackpropFilter(shape, Data(ctx->input(0)), Data(ctx->input(2)),
                                                                  Data(output), attrs_.lanes, Data(&workspace),
                                                                  stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_conv2d_backprop_filter";
  ConvAttrs attrs_;
};

class ConcurrentMatMulGpuOp : public OpKernel {
 public:
  explicit ConcurrentMatMulGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose_b", &transpose_b_));
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }
  void Compute(OpKernelContext* ctx) override {
    MatMulDims d;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareMatMul(ctx, kOp, transpose_b_, &d, &output, &work));
    if (work == Work::kNone) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    if (work == Work::kZeroOutput) {
      OP_REQUIRES_OK(ctx, ZeroOutput(kOp, output, stream));
      return;
    }
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::MatMul(d.m, d.n, d.k, Data(ctx->input(0)), Data(ctx->input(1)),
                                                    transpose_b_, Data(output), lanes_, stream, device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul";
  bool transpose_b_ = false;
  int64_t lanes_ = 1;
};

class ConcurrentMatMulGradWeightsGpuOp : public OpKernel {
 public:
  explicit ConcurrentMatMulGradWeightsGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConcurrency(ctx, kOp, &lanes_));
  }
  void Compute(OpKernelContext* ctx) override {
    MatMulDims d;
    Tensor* output = nullptr;
    Work work;
    OP_REQUIRES_OK(ctx, PrepareMatMulGradWeights(ctx, kOp, &d, &output, &work));
    if (work == Work::kNone) return;
    cudaStream_t stream;
    int device;
    OP_REQUIRES_OK(ctx, OpStream(ctx, &stream, &device));
    OP_REQUIRES_OK(ctx, FromCuda(kOp, cuda::MatMulGradWeights(d.m, d.k, d.n, Data(ctx->input(0)),
                                                               Data(ctx->input(1)), Data(output), lanes_, stream,
                                                               device)));
  }

 private:
  static constexpr const char* kOp = "concurrent_matmul_grad_weights";
  int64_t lanes_ = 1;
};

using tensorflow::DEVICE_GPU;
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2D").Device(DEVICE_GPU).TypeConstraint<float>("T"),
                        ConcurrentConv2DGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropInput")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<float>("T")
                            .HostMemory("input_sizes"),
                        ConcurrentConv2DBackpropInputGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentConv2DBackpropFilter")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<float>("T")
                            .HostMemory("filter_sizes"),
                        ConcurrentConv2DBackpropFilterGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMul").Device(DEVICE_GPU).TypeConstraint<float>("T"),
                        ConcurrentMatMulGpuOp);
REGISTER_KERNEL_BUILDER(Name("Glp>ConcurrentMatMulGradWeights").Device(DEVICE_GPU).TypeConstraint<float>("T"),
                        ConcurrentMatMulGradWeightsGpuOp);

}  // namespace
}  // namespace tf_glp::tf
#endif  // GOOGLE_CUDA
